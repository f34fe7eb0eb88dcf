"""cifar_dir: CIFAR batches are read with a restricted unpickler (a crafted pickle cannot run code)."""

from __future__ import annotations

import os
import pickle
import struct
import sys

import numpy as np
import pytest
import torch

from rankwise.data import DataFileNotFoundError, DataFormatError, get_dataset, load_cifar_dir

# ----------------------------------------------------------------------------------- genuine batches


def _batch(n: int, side: int = 4, seed: int = 0, classes: int = 3) -> tuple[np.ndarray, list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 3 * side * side), dtype=np.uint8), [i % classes for i in range(n)]


def _dump(path, obj, protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=protocol)


def _cifar_dict(data: np.ndarray, labels: list[int], key: bytes = b"labels") -> dict:
    return {
        b"batch_label": b"training batch 1 of 1",
        key: labels,
        b"data": data,
        b"filenames": [f"img_{i}.png".encode() for i in range(len(labels))],
    }


def _py2(b: bytes) -> bytes:
    """A Python 2 ``str`` as protocol 2 writes it (SHORT_BINSTRING / BINSTRING): bytes when loaded."""
    return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<I", len(b)) + b)


def _int(n: int) -> bytes:
    return (b"K" + bytes([n])) if 0 <= n < 256 else (b"J" + struct.pack("<i", n))


def py2_cifar_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """Bytes laid out as the CIFAR-10 website's files (Python 2.7 + numpy 1.x, ``cPickle`` protocol 2):

    a dict of str keys, ``labels`` a list of ints, ``data`` a uint8 array rebuilt by
    ``numpy.core.multiarray._reconstruct`` + ``__setstate__`` with the raw bytes as a str.
    """
    n, d = data.shape
    out = b"\x80\x02}q\x00("  # PROTO 2, EMPTY_DICT, MEMOIZE, MARK
    out += _py2(b"batch_label") + _py2(b"training batch 1 of 5")
    out += _py2(b"labels") + b"](" + b"".join(_int(v) for v in labels) + b"e"
    out += _py2(b"data") + b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _int(0) + b"\x85"
    out += _py2(b"b") + b"\x87R"
    out += b"(" + _int(1) + _int(n) + _int(d) + b"\x86" + b"cnumpy\ndtype\n" + _py2(b"u1") + _int(0) + _int(1)
    out += b"\x87R(" + _int(3) + _py2(b"|") + b"NNN" + _int(-1) + _int(-1) + _int(0) + b"tb"  # dtype state
    out += b"\x89" + _py2(data.tobytes()) + b"tb"  # is_fortran=False, raw bytes; BUILD the array
    out += _py2(b"filenames") + b"](" + b"".join(_py2(f"{i}.png".encode()) for i in range(n)) + b"e"
    return out + b"u."  # SETITEMS, STOP


def test_py2_layout_helper_is_a_valid_pickle() -> None:
    data, labels = _batch(5)
    d = pickle.loads(py2_cifar_batch(data, labels), encoding="bytes")
    assert np.array_equal(d[b"data"], data) and d[b"labels"] == labels


@pytest.mark.parametrize("layout", ["py2", "protocol2", "protocol4", "protocol5"])
def test_genuine_cifar_batches_load(tmp_path, layout: str) -> None:
    parts = {"data_batch_1": _batch(6, seed=1), "data_batch_2": _batch(4, seed=2), "test_batch": _batch(3, seed=3)}
    for name, (data, labels) in parts.items():
        if layout == "py2":
            (tmp_path / name).write_bytes(py2_cifar_batch(data, labels))
        else:
            _dump(tmp_path / name, _cifar_dict(data, labels), protocol=int(layout[-1]))
    _dump(tmp_path / "batches.meta", {b"label_names": [b"cat", b"dog", b"frog"], b"num_vis": 48}, protocol=2)
    d = load_cifar_dir(root=tmp_path)
    assert d.image_shape == (3, 4, 4) and d.num_classes == 3 and d.meta["classes"] == ["cat", "dog", "frog"]
    assert len(d.train) == 10 and len(d.test) == 3
    want = np.concatenate([parts["data_batch_1"][0], parts["data_batch_2"][0]]).reshape(-1, 3, 4, 4) / 255.0
    torch.testing.assert_close(d.train.x, torch.from_numpy(want.astype(np.float32)))  # type: ignore[attr-defined]
    assert d.train_targets.tolist() == parts["data_batch_1"][1] + parts["data_batch_2"][1]
    assert d.test_targets.tolist() == parts["test_batch"][1]


def test_cifar100_layout_and_numpy_labels(tmp_path) -> None:
    data, labels = _batch(6, side=2, classes=5)
    _dump(
        tmp_path / "train",
        {b"data": data, b"fine_labels": np.asarray(labels, dtype=np.int64), b"coarse_labels": labels},
    )
    _dump(tmp_path / "test", {b"data": data[:2], b"fine_labels": [np.int64(v) for v in labels[:2]]})
    _dump(tmp_path / "meta", {b"fine_label_names": [f"c{i}".encode() for i in range(5)]})
    d = get_dataset("cifar_dir", root=str(tmp_path))
    assert d.image_shape == (3, 2, 2) and d.meta["classes"] == ["c0", "c1", "c2", "c3", "c4"]
    assert d.train_targets.tolist() == labels


# ----------------------------------------------------------------------------------- crafted pickles


class _Payload:
    """Unpickling this object calls ``os.system`` (through ``__reduce__``) to create a marker file."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"{sys.executable} -c \"open(r'{self.marker}', 'w').write('pwned')\"",))


def _good_layout(tmp_path) -> None:
    for name in ("data_batch_1", "test_batch"):
        _dump(tmp_path / name, _cifar_dict(*_batch(3)))


def test_pickle_payload_is_not_executed(tmp_path) -> None:
    marker = tmp_path / "marker.txt"
    # sanity: the payload does create the marker under plain pickle (in a throwaway file)
    probe = tmp_path / "probe.txt"
    pickle.loads(pickle.dumps(_Payload(probe)))
    assert probe.exists()
    _good_layout(tmp_path)
    evil = _cifar_dict(*_batch(3))
    evil[b"labels"] = _Payload(marker)
    for protocol in (2, 5):
        _dump(tmp_path / "data_batch_1", evil, protocol=protocol)
        with pytest.raises(DataFormatError, match=r"data_batch_1: not a CIFAR pickle: refusing to load '\w+\.system'"):
            load_cifar_dir(root=tmp_path)
        assert not marker.exists()


def test_payload_in_batches_meta_is_not_executed(tmp_path) -> None:
    marker = tmp_path / "marker.txt"
    _good_layout(tmp_path)
    _dump(tmp_path / "batches.meta", {b"label_names": _Payload(marker)})
    with pytest.raises(DataFormatError, match=r"batches\.meta: not a CIFAR pickle: refusing to load"):
        load_cifar_dir(root=tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        b"\x80\x02cbuiltins\neval\nX\x04\x00\x00\x001+1\x85R.",  # builtins.eval
        b"\x80\x02csubprocess\nPopen\n.",  # any other module
        b"\x80\x02cnumpy\nload\n.",  # a numpy function outside array reconstruction
        b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x06\x00\x00\x00base64\x86R.",  # encode, not latin1
        b"\x80\x02cnumpy\ndtype\nX\x01\x00\x00\x00O\x85R.",  # object dtype
        b"\x80\x02X\x01\x00\x00\x00xQ.",  # persistent id
    ],
    ids=["eval", "subprocess", "numpy.load", "codecs", "object-dtype", "persid"],
)
def test_refused_globals(tmp_path, payload: bytes) -> None:
    _good_layout(tmp_path)
    (tmp_path / "test_batch").write_bytes(payload)
    with pytest.raises(DataFormatError, match=r"test_batch: not a CIFAR pickle: .*(refusing|not allowed)"):
        load_cifar_dir(root=tmp_path)


def test_bad_batches_name_the_file(tmp_path) -> None:
    with pytest.raises(DataFileNotFoundError, match=r"missing: directory not found") as info:
        load_cifar_dir(root=tmp_path / "missing")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(DataFormatError, match=r"no CIFAR pickle files"):
        load_cifar_dir(root=tmp_path)
    _good_layout(tmp_path)
    good = (tmp_path / "test_batch").read_bytes()
    cases = {
        b"": r"test_batch: the file is empty",
        good[: len(good) // 2]: r"test_batch: not a CIFAR pickle: pickle data was truncated",
        b"this is not a pickle": r"test_batch: not a (valid )?CIFAR pickle",
        pickle.dumps([1, 2, 3]): r"test_batch: expected a CIFAR pickle holding a dict, got list",
        pickle.dumps({b"data": np.zeros((2, 48), np.uint8)}): r"expected a CIFAR pickle with 'data' and 'labels'",
        pickle.dumps({b"data": np.zeros((2, 48), np.uint8), b"labels": [0]}): r"test_batch: 1 labels for 2 images",
        pickle.dumps({b"data": np.zeros((2, 47), np.uint8), b"labels": [0, 1]}): r"'data' must have shape",
        pickle.dumps({b"data": np.zeros((2, 30), np.uint8), b"labels": [0, 1]}): r"not 3 square channels",
        pickle.dumps({b"data": np.full((2, 48), 300), b"labels": [0, 1]}): r"'data' values must be in 0\.\.255",
        pickle.dumps({b"data": np.zeros((2, 48), np.float32), b"labels": [0, 1]}): r"'data' must hold integers",
        pickle.dumps({b"data": np.zeros((2, 48), np.uint8), b"labels": [0, -1]}): r"'labels' must be >= 0",
        pickle.dumps({b"data": np.zeros((2, 12), np.uint8), b"labels": [0, 1]}): r"different image sizes",
    }
    for content, message in cases.items():
        (tmp_path / "test_batch").write_bytes(content)
        with pytest.raises(DataFormatError, match=message):
            load_cifar_dir(root=tmp_path)


def test_cli_data_show_refuses_a_crafted_pickle(tmp_path) -> None:
    """``rankwise data show cifar_dir -O root=DIR`` (a hostile folder): one error line, no code run."""
    from typer.testing import CliRunner

    from rankwise.cli import app

    marker = tmp_path / "marker.txt"
    _good_layout(tmp_path)
    evil = _cifar_dict(*_batch(3))
    evil[b"data"] = _Payload(marker)
    _dump(tmp_path / "data_batch_1", evil)
    r = CliRunner().invoke(app, ["data", "show", "cifar_dir", "-O", f"root={tmp_path}"])
    assert r.exit_code == 2, r.output
    assert not marker.exists()
    out = " ".join(r.output.split())
    assert "data_batch_1: not a CIFAR pickle: refusing to load" in out and "Traceback" not in out
    _good_layout(tmp_path)
    r = CliRunner().invoke(app, ["data", "show", "cifar_dir", "-O", f"root={tmp_path}"])
    assert r.exit_code == 0 and "classification data: 3 classes, train 3, test 3" in r.output

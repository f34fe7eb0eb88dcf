"""DIR image datasets: generated PNGs + split CSV, and the real AgeDB-DIR split file when present."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from rankwise.data import DataFormatError, dir_images, get_dataset

pytest.importorskip("torchvision")
Image = pytest.importorskip("PIL.Image")


def _make(tmp_path, n_per_split=(6, 3, 3), size=(40, 30)):
    root = tmp_path / "images"
    (root / "AgeDB").mkdir(parents=True)
    rows = ["age,path,split"]
    rng = np.random.default_rng(0)
    k = 0
    for split, n in zip(("train", "val", "test"), n_per_split):
        for _ in range(n):
            arr = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
            rel = f"AgeDB/{k}_person_{20 + k}.png"
            Image.fromarray(arr).save(root / rel)
            rows.append(f"{20 + k},{rel},{split}")
            k += 1
    csv_path = tmp_path / "split.csv"
    csv_path.write_text("\n".join(rows) + "\n")
    return csv_path, root


def test_dir_images_items(tmp_path) -> None:
    csv_path, root = _make(tmp_path)
    d = dir_images(csv_path, root, image_size=32)
    assert d.sizes() == (6, 3, 3) and d.modality == "images" and d.bin_width == 1.0 and d.input_dim is None
    assert d.train_labels.dtype == np.float64
    np.testing.assert_array_equal(d.train_labels, np.arange(20, 26))
    x, y = d.train[0]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32
    assert y.shape == () and y.dtype == torch.float32 and float(y) == 20.0
    assert -1.0 <= float(x.min()) and float(x.max()) <= 1.0
    xv, yv = d.val[1]
    assert xv.shape == (3, 32, 32) and float(yv) == 27.0
    # eval transform is deterministic, train transform is random (crop with padding + flip)
    assert torch.equal(d.test[0][0], d.test[0][0])
    torch.manual_seed(0)
    a = torch.stack([d.train[0][0] for _ in range(4)])
    assert not all(torch.equal(a[0], a[i]) for i in range(1, 4))
    loader = torch.utils.data.DataLoader(d.train, batch_size=4)
    xb, yb = next(iter(loader))
    assert xb.shape == (4, 3, 32, 32) and yb.shape == (4,)


def test_dir_images_registry_and_custom_transform(tmp_path) -> None:
    csv_path, root = _make(tmp_path)
    d = get_dataset("agedb_dir", csv=csv_path, root=root, image_size=16)
    assert d.name == "agedb_dir" and d.test[0][0].shape == (3, 16, 16)
    from torchvision import transforms as T

    d2 = dir_images(csv_path, root, train_transform=T.Compose([T.Resize((8, 8)), T.ToTensor()]), image_size=16)
    assert d2.train[0][0].shape == (3, 8, 8) and d2.val[0][0].shape == (3, 16, 16)
    only = get_dataset("imdb_wiki_dir", csv=csv_path, labels_only=True)
    assert only.sizes() == (6, 3, 3)
    with pytest.raises(RuntimeError, match="labels_only=True"):
        only.train[0]
    with pytest.raises(ValueError, match="pass `csv`"):
        get_dataset("agedb_dir")


def test_dir_images_errors(tmp_path) -> None:
    csv_path, root = _make(tmp_path)
    lines = csv_path.read_text().splitlines()
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join([*lines[:3], "abc,AgeDB/0_person_20.png,train", *lines[3:]]) + "\n")
    with pytest.raises(DataFormatError, match=r"bad\.csv, row 4: column 'age': cannot parse 'abc'"):
        dir_images(bad, root)
    bad.write_text("\n".join([*lines, "30,AgeDB/0_person_20.png,holdout"]) + "\n")
    with pytest.raises(DataFormatError, match=r"bad\.csv, row 14: column 'split': expected one of"):
        dir_images(bad, root)
    bad.write_text("\n".join([*lines, "30,AgeDB/missing.png,test"]) + "\n")
    with pytest.raises(DataFormatError, match=r"bad\.csv, row 14: image file not found: .*missing\.png"):
        dir_images(bad, root)
    assert dir_images(bad, root, labels_only=True).sizes() == (6, 3, 4)
    (root / "AgeDB" / "broken.png").write_bytes(b"not a png")
    bad.write_text("\n".join([*lines, "30,AgeDB/broken.png,test"]) + "\n")
    d = dir_images(bad, root, image_size=8)
    with pytest.raises(DataFormatError, match=r"bad\.csv, row 14: cannot read image .*broken\.png"):
        d.test[3]
    bad.write_text("age,file,split\n1,a.png,train\n")
    with pytest.raises(DataFormatError, match=r"bad\.csv, row 1: missing column\(s\) \['path'\]"):
        dir_images(bad, root)
    bad.write_text("\n".join(lines[:7]) + "\n")  # train only
    with pytest.raises(DataFormatError, match=r"no rows for split\(s\) \['val', 'test'\]"):
        dir_images(bad, root)


def test_agedb_dir_split_file(shared_dir) -> None:
    csv_path = shared_dir / "data" / "agedb-dir" / "agedb.csv"
    if not csv_path.is_file():
        pytest.skip("agedb.csv is absent")
    d = get_dataset("agedb_dir", csv=csv_path, labels_only=True)
    assert d.sizes() == (12208, 2140, 2140)
    assert d.train_labels.min() == 1 and d.train_labels.max() == 101
    assert max(collections.Counter(d.test_labels.tolist()).values()) == 30
    counts = collections.Counter(d.train_labels.tolist())
    groups: dict[str, list[float]] = {"many": [], "medium": [], "few": []}
    for age in sorted(set(d.test_labels.tolist())):
        c = counts.get(age, 0)
        groups["many" if c > 100 else "few" if c < 20 else "medium"].append(age)
    test_counts = collections.Counter(d.test_labels.tolist())
    assert {k: len(v) for k, v in groups.items()} == {"many": 51, "medium": 16, "few": 25}
    assert {k: sum(test_counts[a] for a in v) for k, v in groups.items()} == {"many": 1530, "medium": 448, "few": 162}


def test_agedb_split_follows_dir_rule(shared_dir) -> None:
    """The AgeDB-DIR split file is min(30, count // 3) per age in val and in test (rankwise.data.dir_split)."""
    csv_path = shared_dir / "data" / "agedb-dir" / "agedb.csv"
    if not csv_path.is_file():
        pytest.skip("agedb.csv is absent")
    from rankwise.data import dir_split

    d = get_dataset("agedb_dir", csv=csv_path, labels_only=True)
    labels = np.concatenate([d.train_labels, d.val_labels, d.test_labels])
    _, va, te = dir_split(labels, per_label=30, seed=0)
    assert collections.Counter(labels[va].tolist()) == collections.Counter(d.val_labels.tolist())
    assert collections.Counter(labels[te].tolist()) == collections.Counter(d.test_labels.tolist())


def test_an_image_list_records_every_image_it_names(tmp_path) -> None:
    """Inside ``recording_reads`` the loader records each image (a run fingerprints them)."""
    from rankwise.data._files import recording_reads

    csv_path, root = _make(tmp_path)
    with recording_reads() as read:
        dir_images(csv_path, root, image_size=32)
    assert {p.resolve() for p in (root / "AgeDB").iterdir()} <= {p.resolve() for p in read}

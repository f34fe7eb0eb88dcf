"""Bad data files: every loader raises a one-line DataFormatError (or DataFileNotFoundError) naming the file.

One test per case and loader: duplicated column names, UTF-8 byte-order mark (accepted), non-UTF-8
text, labels beyond float32 (1e39) or huge (1e300), non-finite values, ``1_000``, a missing path,
corrupt images, empty files and one-row files.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch

from rankwise.data import (
    DataFileNotFoundError,
    DataFormatError,
    dir_images,
    load_abalone,
    load_csv,
    load_image_folder,
    load_mnist5k,
    load_mnist5k_arrays,
    load_stsb_dir,
    read_sts_tsv,
)


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


# ============================================================================================ CSV


def _csv(tmp_path, header: str, rows: list[str], name: str = "data.csv", encoding: str = "utf-8", bom: bool = False):
    p = tmp_path / name
    text = "\n".join([header, *rows]) + "\n"
    p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode(encoding))
    return p


def _rows(n: int = 20) -> list[str]:
    return [f"{i * 0.1:.1f},{(i * 7) % 5},{i % 6}" for i in range(n)]


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("x1,x1,y", r"data\.csv, row 1: duplicated column name 'x1': columns 1 and 2 are both named 'x1'"),
        ("x1,y,y", r"data\.csv, row 1: duplicated column name 'y': columns 2 and 3 are both named 'y'"),
        ("x1, y ,y", r"columns 2 and 3 are both named 'y'"),
        ("x1,,y", r"data\.csv, row 1: column 2 has no name"),
    ],
)
def test_csv_duplicated_or_empty_column_names(tmp_path, header: str, message: str) -> None:
    p = _csv(tmp_path, header, _rows())
    with pytest.raises(DataFormatError, match=message) as err:
        load_csv(p, "y")
    _one_line(err)


def test_csv_utf8_bom_is_stripped(tmp_path) -> None:
    p = _csv(tmp_path, "y,a,b", [r[::-1] for r in _rows()], bom=True)
    d = load_csv(p, "y", standardize_features=False)
    assert d.label_name == "y" and d.meta["feature_names"] == ["a", "b"]
    assert sum(d.sizes()) == 20


@pytest.mark.parametrize(
    ("encoding", "message"),
    [
        ("latin-1", r"data\.csv: not valid UTF-8 text \(byte 0xe9 on line 3\): save it as UTF-8"),
        ("utf-16", r"data\.csv: not valid UTF-8 text \(byte 0xff on line 1\): it looks like UTF-16"),
    ],
)
def test_csv_non_utf8(tmp_path, encoding: str, message: str) -> None:
    rows = _rows()
    rows[1] = "0.5,1,3"
    p = _csv(tmp_path, "a,b,y", rows, encoding=encoding)
    if encoding == "latin-1":
        p.write_bytes(p.read_bytes().replace(b"0.5,1,3", b"0.5,1,3\xe9"))
    with pytest.raises(DataFormatError, match=message) as err:
        load_csv(p, "y")
    _one_line(err)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e39", r"value '1e39' is outside the float32 range"),
        ("-3.5e38", r"value '-3.5e38' is outside the float32 range"),
        ("1e300", r"value '1e300' is outside the float32 range"),
        ("1e400", r"value '1e400' is outside the float32 range"),
        ("inf", r"value 'inf' is not finite"),
        ("-Infinity", r"value '-Infinity' is not finite"),
        ("NaN", r"value 'NaN' is not finite"),
        ("1_000", r"cannot parse '1_000' as a number \(digit separators such as '_' are not accepted\)"),
        ("١٢", r"cannot parse '١٢' as a number"),
        ("0x10", r"cannot parse '0x10' as a number"),
    ],
)
@pytest.mark.parametrize("column", ["y", "a"])
def test_csv_bad_numbers(tmp_path, value: str, message: str, column: str) -> None:
    rows = _rows()
    a, b, y = rows[4].split(",")
    rows[4] = ",".join([value if column == "a" else a, b, value if column == "y" else y])
    p = _csv(tmp_path, "a,b,y", rows)
    with pytest.raises(DataFormatError, match=rf"data\.csv, row 6: column '{column}': " + message) as err:
        load_csv(p, "y")
    _one_line(err)


def test_csv_number_syntax_accepted(tmp_path) -> None:
    rows = [f"{v},{i},{i % 5}" for i, v in enumerate(["1", "+2", "-3.", ".5", " 6 ", "7e1", "8E-1", "3.4e38"] * 3)]
    d = load_csv(_csv(tmp_path, "a,b,y", rows), "y", standardize_features=False, val_fraction=0.2)
    xs = torch.cat([d.train.x, d.val.x, d.test.x])[:, 0]  # type: ignore[attr-defined]
    want = np.float32([1.0, 2.0, -3.0, 0.5, 6.0, 70.0, 0.8, 3.4e38])
    assert sorted(set(xs.tolist())) == sorted(want.tolist())


def test_csv_missing_path_and_directory(tmp_path) -> None:
    with pytest.raises(DataFileNotFoundError, match=r"nope\.csv: data file not found") as err:
        load_csv(tmp_path / "nope.csv", "y")
    assert isinstance(err.value, FileNotFoundError) and isinstance(err.value, DataFormatError)
    _one_line(err)
    with pytest.raises(DataFormatError, match=r": is a directory, expected a data file"):
        load_csv(tmp_path, "y")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"empty\.csv: the file is empty"),
        (b"\xef\xbb\xbf", r"empty\.csv: the file is empty"),
        (b"\n\n", r"empty\.csv: the file is empty"),
        (b"a,b,y\n", r"empty\.csv: no data rows"),
    ],
)
def test_csv_empty_files(tmp_path, content: bytes, message: str) -> None:
    p = tmp_path / "empty.csv"
    p.write_bytes(content)
    with pytest.raises(DataFormatError, match=message):
        load_csv(p, "y")


def test_csv_one_row_file(tmp_path) -> None:
    p = _csv(tmp_path, "a,b,y", ["1,2,3"])
    with pytest.raises(DataFormatError, match=r"data\.csv: 1 data row\(s\) are too few: the random .* 1/0/0") as err:
        load_csv(p, "y")
    _one_line(err)
    with pytest.raises(DataFormatError, match=r"data\.csv: 1 data row\(s\) are too few: the dir .* 1/0/0"):
        load_csv(p, "y", split="dir")


def test_csv_malformed_record(tmp_path) -> None:
    rows = _rows()
    rows[3] = '"' + "9" * 200_000 + '",1,2'  # beyond the csv module's field size limit
    p = _csv(tmp_path, "a,b,y", rows)
    with pytest.raises(DataFormatError, match=r"data\.csv, row 5: malformed CSV record: field larger than"):
        load_csv(p, "y")


def test_abalone_path_errors(tmp_path) -> None:
    header = "sex,length,diameter,height,whole_weight,shucked_weight,viscera_weight,shell_weight,rings"
    good = "M,0.4,0.3,0.1,0.5,0.2,0.1,0.15,9"
    p = _csv(tmp_path, header, [good] * 20, name="abalone.csv", bom=True)
    d = load_abalone(path=p, per_label=3)  # BOM accepted
    assert d.sizes() == (14, 3, 3)
    p = _csv(tmp_path, header, [good], name="abalone.csv")
    with pytest.raises(DataFormatError, match=r"abalone\.csv: 1 data row\(s\) are too few"):
        load_abalone(path=p)
    p = _csv(tmp_path, header.replace("height", "length"), [good] * 5, name="abalone.csv")
    with pytest.raises(DataFormatError, match=r"duplicated column name 'length': columns 2 and 4"):
        load_abalone(path=p)
    p = _csv(tmp_path, header, [good, good.replace(",9", ",1e39")], name="abalone.csv")
    with pytest.raises(DataFormatError, match=r"abalone\.csv, row 3: column 'rings': value '1e39' is outside"):
        load_abalone(path=p)
    with pytest.raises(DataFileNotFoundError, match=r"gone\.csv: data file not found"):
        load_abalone(path=tmp_path / "gone.csv")


# ============================================================================================ STS-B TSV

HEADER = "index\tsentence1\tsentence2\tscore"


def _tsv(tmp_path, rows: list[str], name: str = "train_new.tsv", header: str = HEADER, prefix: bytes = b""):
    p = tmp_path / name
    p.write_bytes(prefix + ("\n".join([header, *rows]) + "\n").encode())
    return p


def _sts_rows(n: int = 3) -> list[str]:
    return [f"{i}\tA man plays.\tA man is playing.\t{i % 5}.5" for i in range(n)]


def test_sts_duplicated_columns(tmp_path) -> None:
    p = _tsv(tmp_path, _sts_rows(), header="index\tsentence1\tsentence1\tscore")
    with pytest.raises(DataFormatError, match=r"train_new\.tsv, row 1: duplicated column name 'sentence1'"):
        read_sts_tsv(p)


def test_sts_bom_and_one_row_files(tmp_path) -> None:
    for name in ("train_new.tsv", "dev_new.tsv", "test_new.tsv"):
        _tsv(tmp_path, _sts_rows(1), name=name, prefix=b"\xef\xbb\xbf")
    d = load_stsb_dir(tmp_path)
    assert d.sizes() == (1, 1, 1) and d.train_labels.tolist() == [0.5]


def test_sts_non_utf8(tmp_path) -> None:
    p = _tsv(tmp_path, _sts_rows())
    p.write_bytes(p.read_bytes().replace(b"A man plays.", b"A man pl\xe4ys."))
    with pytest.raises(DataFormatError, match=r"train_new\.tsv: not valid UTF-8 text \(byte 0xe4 on line 2\)"):
        read_sts_tsv(p)


@pytest.mark.parametrize(
    ("score", "message"),
    [
        ("1e39", r"value '1e39' is outside the float32 range"),
        ("1e300", r"value '1e300' is outside the float32 range"),
        ("nan", r"value 'nan' is not finite"),
        ("1_0", r"cannot parse '1_0' as a number \(digit separators"),
        ("7", r"expected a value in \[0, 5\], got '7'"),
    ],
)
def test_sts_bad_scores(tmp_path, score: str, message: str) -> None:
    rows = _sts_rows()
    rows[1] = rows[1].rsplit("\t", 1)[0] + "\t" + score
    p = _tsv(tmp_path, rows)
    with pytest.raises(DataFormatError, match=r"train_new\.tsv, row 3: column 'score': " + message):
        read_sts_tsv(p)


def test_sts_missing_and_empty(tmp_path) -> None:
    with pytest.raises(DataFileNotFoundError, match=r"train_new\.tsv: STS-B file not found"):
        load_stsb_dir(tmp_path)
    (tmp_path / "train_new.tsv").write_bytes(b"")
    with pytest.raises(DataFormatError, match=r"train_new\.tsv: the file is empty"):
        load_stsb_dir(tmp_path)
    _tsv(tmp_path, [])
    with pytest.raises(DataFormatError, match=r"train_new\.tsv: no data rows"):
        load_stsb_dir(tmp_path)


# ============================================================================================ DIR images

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("torchvision")


def _agedb(tmp_path, ages=("20", "21", "22"), header: str = "age,path,split", bom: bool = False):
    root = tmp_path / "images"
    root.mkdir(exist_ok=True)
    rows = [header]
    for i, (age, split) in enumerate(zip(ages, ("train", "val", "test"))):
        Image.fromarray(np.full((8, 8, 3), 40 * i, dtype=np.uint8)).save(root / f"{i}.png")
        rows.append(f"{age},{i}.png,{split}")
    p = tmp_path / "agedb.csv"
    p.write_bytes((b"\xef\xbb\xbf" if bom else b"") + ("\n".join(rows) + "\n").encode())
    return p, root


def test_agedb_bom_and_one_row_per_split(tmp_path) -> None:
    p, root = _agedb(tmp_path, bom=True)
    d = dir_images(p, root, image_size=8)
    assert d.sizes() == (1, 1, 1) and d.train[0][0].shape == (3, 8, 8)


def test_agedb_duplicated_columns(tmp_path) -> None:
    p, root = _agedb(tmp_path, header="age,path,age")
    with pytest.raises(DataFormatError, match=r"agedb\.csv, row 1: duplicated column name 'age': columns 1 and 3"):
        dir_images(p, root)


@pytest.mark.parametrize(
    ("age", "message"),
    [
        ("1e39", r"value '1e39' is outside the float32 range"),
        ("1e300", r"value '1e300' is outside the float32 range"),
        ("inf", r"value 'inf' is not finite"),
        ("1_000", r"cannot parse '1_000' as a number"),
    ],
)
def test_agedb_bad_ages(tmp_path, age: str, message: str) -> None:
    p, root = _agedb(tmp_path, ages=("20", age, "22"))
    with pytest.raises(DataFormatError, match=r"agedb\.csv, row 3: column 'age': " + message):
        dir_images(p, root)


def test_agedb_non_utf8_empty_and_one_row(tmp_path) -> None:
    p, root = _agedb(tmp_path)
    p.write_bytes(p.read_bytes().replace(b"1.png", b"\xe91.png"))
    with pytest.raises(DataFormatError, match=r"agedb\.csv: not valid UTF-8 text \(byte 0xe9 on line 3\)"):
        dir_images(p, root)
    p.write_bytes(b"")
    with pytest.raises(DataFormatError, match=r"agedb\.csv: the file is empty"):
        dir_images(p, root)
    p.write_text("age,path,split\n20,0.png,train\n")
    with pytest.raises(DataFormatError, match=r"agedb\.csv: no rows for split\(s\) \['val', 'test'\]"):
        dir_images(p, root)


def test_agedb_missing_paths(tmp_path) -> None:
    p, root = _agedb(tmp_path)
    with pytest.raises(DataFileNotFoundError, match=r"nope\.csv: DIR split file not found"):
        dir_images(tmp_path / "nope.csv", root)
    with pytest.raises(DataFileNotFoundError, match=r"nowhere: directory not found \(`root` must be"):
        dir_images(p, tmp_path / "nowhere")
    (root / "1.png").unlink()
    with pytest.raises(DataFileNotFoundError, match=r"agedb\.csv, row 3: image file not found: .*1\.png"):
        dir_images(p, root)
    d = dir_images(p, root, check_files=False, image_size=8)
    with pytest.raises(DataFileNotFoundError, match=r"agedb\.csv, row 3: image file not found: .*1\.png"):
        d.val[0]


@pytest.mark.parametrize("corruption", ["garbage", "empty", "truncated"])
def test_agedb_corrupt_image(tmp_path, corruption: str) -> None:
    p, root = _agedb(tmp_path)
    img = root / "2.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(img)
    data = img.read_bytes()
    img.write_bytes({"garbage": b"not an image at all", "empty": b"", "truncated": data[: len(data) // 2]}[corruption])
    d = dir_images(p, root, image_size=8)
    with pytest.raises(DataFormatError, match=r"agedb\.csv, row 4: cannot read image .*2\.png: ") as err:
        d.test[0]
    _one_line(err)


def test_agedb_corrupt_image_in_dataloader_worker(tmp_path) -> None:
    """torch re-raises a worker's error as ``type(err)(traceback)``: still a one-line DataFormatError."""
    p, root = _agedb(tmp_path)
    (root / "0.png").write_bytes(b"broken")
    d = dir_images(p, root, image_size=8)
    loader = torch.utils.data.DataLoader(d.train, batch_size=1, num_workers=1)
    with pytest.raises(DataFormatError, match=r"^\S*agedb\.csv, row 2: cannot read image \S*0\.png: ") as err:
        next(iter(loader))
    _one_line(err)
    assert "Traceback" in (err.value.worker_traceback or "")


# ============================================================================================ image folders


def _folder(root, per_class: int = 3):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(np.full((6, 6, 3), 30 * i, dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


@pytest.mark.slow
def test_image_folder_errors(tmp_path) -> None:
    with pytest.raises(DataFileNotFoundError, match=r"missing: directory not found"):
        load_image_folder(root=tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFormatError, match=r"empty: no images found"):
        load_image_folder(root=tmp_path / "empty")
    root = _folder(tmp_path / "imgs")
    (root / "b" / "1.png").write_bytes(b"")
    with pytest.raises(DataFormatError, match=r"imgs/b/1\.png: cannot read the image: ") as err:
        load_image_folder(root=root, image_size=4)
    _one_line(err)
    one = _folder(tmp_path / "one", per_class=1)
    with pytest.raises(DataFormatError, match=r"one: 2 image\(s\) are too few: test_fraction=0\.2 gives 2 train and 0"):
        load_image_folder(root=one, image_size=4)


# ============================================================================================ mnist CSV


def _digits(n: int) -> str:
    return "\n".join(",".join(["0"] * 784 + [str(i % 10)]) for i in range(n)) + "\n"


def test_mnist_file_errors(tmp_path) -> None:
    with pytest.raises(DataFileNotFoundError, match=r"gone\.csv: MNIST CSV file not found"):
        load_mnist5k_arrays(path=tmp_path / "gone.csv")
    p = tmp_path / "digits.csv"
    p.write_bytes(b"")
    with pytest.raises(DataFormatError, match=r"digits\.csv: no data rows"):
        load_mnist5k_arrays(path=p)
    p.write_bytes(_digits(3).encode().replace(b"0,0,0,", b"0,\xe9,0,", 1))
    with pytest.raises(DataFormatError, match=r"digits\.csv: not valid UTF-8 text \(byte 0xe9 on line 1\)"):
        load_mnist5k_arrays(path=p)
    p.write_text(_digits(3).replace("0,0,", "1_0,0,", 1))
    with pytest.raises(DataFormatError, match=r"digits\.csv, row 1: field 1: expected an integer, got '1_0'"):
        load_mnist5k_arrays(path=p)
    p.write_text(_digits(1))
    with pytest.raises(DataFormatError, match=r"digits\.csv: 1 digit\(s\) are too few: .* 'test': 0"):
        load_mnist5k(path=p)
    g = tmp_path / "digits.csv.gz"
    g.write_bytes(gzip.compress(_digits(40).encode())[:-20])
    with pytest.raises(DataFormatError, match=r"digits\.csv\.gz: not a valid gzip file"):
        load_mnist5k_arrays(path=g)
    g.write_bytes(gzip.compress(("\ufeff" + _digits(40)).encode()))
    assert load_mnist5k_arrays(path=g)[0].shape == (40, 28, 28)

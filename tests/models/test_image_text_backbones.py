"""ResNet, SmallCNN and TextPairEncoder backbones: shapes, backward, options, errors."""

from __future__ import annotations

import pytest
import torch

from rankwise.models import SmallCNN, TextPairEncoder, backbone_info, build_backbone, list_backbones, resnet_backbone


def _grads_ok(net: torch.nn.Module) -> bool:
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    return all(g is not None and torch.isfinite(g).all() for g in grads)


# ------------------------------------------------------------------------------------------------ resnet


def test_resnet18_shapes_backward(device: torch.device) -> None:
    pytest.importorskip("torchvision")
    net, dim = resnet_backbone("resnet18")
    net = net.to(device)
    x = torch.randn(2, 3, 32, 32, device=device)
    out = net(x)
    assert dim == 512 and out.shape == (2, 512) and out.device.type == device.type
    out.sum().backward()
    assert _grads_ok(net)


def test_resnet_in_channels_and_registry() -> None:
    pytest.importorskip("torchvision")
    net, dim = build_backbone("resnet18", in_channels=1)
    assert dim == 512 and net(torch.randn(2, 1, 32, 32)).shape == (2, 512)
    net50, dim50 = build_backbone("resnet", name="resnet50")
    assert dim50 == 2048 and isinstance(net50.fc, torch.nn.Identity)
    assert {"resnet18", "resnet34", "resnet50", "resnet"} <= set(list_backbones())
    assert "2048-d" in backbone_info("resnet50")
    with pytest.raises(ValueError, match="`name` must be one of"):
        resnet_backbone("vgg16")


def test_resnet_local_weights(tmp_path) -> None:
    pytest.importorskip("torchvision")
    torch.manual_seed(1)
    src, _ = resnet_backbone("resnet18")
    state = {f"module.{k}": v for k, v in src.state_dict().items()}
    state["module.fc.weight"] = torch.randn(10, 512)  # a classifier head is ignored
    path = tmp_path / "w.pt"
    torch.save(state, path)
    torch.manual_seed(2)
    net, _ = resnet_backbone("resnet18", weights_path=path)
    src.eval()
    net.eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(net(x), src(x))
    torch.save({"state_dict": src.state_dict()}, path)
    resnet_backbone("resnet18", weights_path=path)  # lightning-style wrapper dict
    with pytest.raises(ValueError, match=r"does not match resnet18 \(in_channels=1\)"):
        resnet_backbone("resnet18", weights_path=path, in_channels=1)
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, path)
    with pytest.raises(ValueError, match=r"missing keys \['bn1"):
        resnet_backbone("resnet18", weights_path=path)
    with pytest.raises(FileNotFoundError, match="`weights_path` not found"):
        resnet_backbone("resnet18", weights_path=tmp_path / "nope.pt")


# ------------------------------------------------------------------------------------------------ small cnn


def test_small_cnn_shapes_backward(device: torch.device) -> None:
    net = SmallCNN(feature_dim=16).to(device)
    for shape in [(3, 1, 28, 28), (2, 1, 28, 112), (4, 1, 8, 8)]:
        out = net(torch.randn(*shape, device=device))
        assert out.shape == (shape[0], 16)
    net.zero_grad()
    net(torch.randn(3, 1, 28, 112, device=device)).sum().backward()
    assert _grads_ok(net)
    net3, dim = build_backbone("small_cnn", in_channels=3, feature_dim=8)
    assert dim == 8 and net3(torch.randn(2, 3, 20, 20)).shape == (2, 8)
    with pytest.raises(ValueError, match=r"`x` must have shape \(B, 1, H, W\), got \(2, 3, 28, 28\)"):
        net(torch.randn(2, 3, 28, 28, device=device))
    with pytest.raises(ValueError, match="`feature_dim` must be a positive int"):
        SmallCNN(feature_dim=0)


def test_small_cnn_sees_digit_position() -> None:
    """Pooling keeps the left-right layout: swapping the halves of a strip changes the features."""
    net = SmallCNN(feature_dim=16).eval()
    x = torch.zeros(1, 1, 28, 112)
    x[..., :28] = torch.rand(28, 28)
    swapped = x.flip(-1)
    assert not torch.allclose(net(x), net(swapped))


# ------------------------------------------------------------------------------------------------ text


@pytest.mark.parametrize("rnn", ["lstm", "gru"])
def test_text_pair_encoder_shapes_backward(device: torch.device, rnn: str) -> None:
    enc = TextPairEncoder(vocab_size=30, embed_dim=8, hidden=6, feature_dim=5, rnn=rnn).to(device)
    a = torch.tensor([[5, 6, 7, 2], [9, 0, 0, 0], [0, 0, 0, 0]], device=device)  # third sentence empty
    b = torch.tensor([[8, 0], [4, 3], [1, 0]], device=device)
    out = enc((a, b))
    assert out.shape == (3, 5) and torch.isfinite(out).all()
    torch.testing.assert_close(enc(a, b), out)
    out.sum().backward()
    assert _grads_ok(enc)
    assert enc.embedding.weight.grad[0].abs().sum() == 0  # padding embedding never updated


def test_text_pair_encoder_ignores_padding() -> None:
    enc = TextPairEncoder(vocab_size=30, embed_dim=8, hidden=6, feature_dim=5).eval()
    a = torch.tensor([[5, 6, 7]])
    b = torch.tensor([[8, 9]])
    padded = enc((torch.tensor([[5, 6, 7, 0, 0]]), torch.tensor([[8, 9, 0]])))
    torch.testing.assert_close(enc((a, b)), padded)
    # batch composition does not change a row's features
    other = torch.tensor([[1, 2, 3, 4, 5, 6]])
    both = enc((torch.cat([torch.nn.functional.pad(a, (0, 3)), other]), torch.tensor([[8, 9], [3, 0]])))
    torch.testing.assert_close(both[:1], padded)


def test_text_pair_encoder_registry_and_errors() -> None:
    net, dim = build_backbone("text_pair", vocab_size=20, embed_dim=4, hidden=4, feature_dim=7)
    assert dim == 7 and net((torch.tensor([[3, 4]]), torch.tensor([[5]]))).shape == (1, 7)
    with pytest.raises(TypeError, match="`x` must be a pair"):
        net(torch.tensor([[3, 4]]))
    with pytest.raises(ValueError, match="token ids must be an int64 tensor"):
        net((torch.randn(1, 2), torch.randn(1, 2)))
    with pytest.raises(ValueError, match="`rnn` must be one of"):
        TextPairEncoder(10, rnn="transformer")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`vocab_size` must be a positive int"):
        TextPairEncoder(0)


def test_text_pipeline_end_to_end(tmp_path) -> None:
    """stsb loader -> collate -> encoder -> linear head -> loss backward."""
    from rankwise.data import collate_text_pairs, load_stsb_dir

    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    rows = [f"{i}\tg\tf\t2012\t{i}\tnone\tnone\tword{i} is here\tand word{i + 1} there\t{i % 5}" for i in range(6)]
    for name in ("train_new.tsv", "dev_new.tsv", "test_new.tsv"):
        (tmp_path / name).write_text("\n".join([header, *rows]) + "\n")
    d = load_stsb_dir(tmp_path)
    net, dim = build_backbone("text_pair", **d.meta["backbone_options"], embed_dim=8, hidden=8, feature_dim=4)
    assert net.vocab_size == d.meta["vocab_size"]
    head = torch.nn.Linear(dim, 1)
    loader = torch.utils.data.DataLoader(d.train, batch_size=4, collate_fn=collate_text_pairs)
    x, y = next(iter(loader))
    loss = torch.nn.functional.l1_loss(head(net(x)).squeeze(-1), y)
    loss.backward()
    assert torch.isfinite(loss)

"""The model registry: shapes for every data set, parameter counts, input checks, deterministic init."""
import pytest
import torch
import torch.nn.functional as F

from ringsgd.data import load_dataset
from ringsgd.errors import UsageError
from ringsgd.models import MODELS, build_model, default_model

# (model, in_channels, image_size): each model on the data set shapes it takes (digits/mnist: 1x28, cifar10: 3x32)
CASES = [("lenet", 1, 28), ("lenet", 3, 28), ("cifar10_quick", 3, 32), ("cifar10_quick", 1, 32),
         ("resnet20", 1, 28), ("resnet20", 3, 28), ("resnet20", 1, 32), ("resnet20", 3, 32)]


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name,channels,size", CASES)
def test_output_shape_and_every_parameter_learns(name, channels, size):
    torch.manual_seed(0)
    model = build_model(name, channels, 7, size)
    out = model(torch.randn(3, channels, size, size))
    assert out.shape == (3, 7)
    F.cross_entropy(out, torch.tensor([0, 3, 6])).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name,low,high,exact", [
    ("lenet", 430_000, 432_000, 431_080),
    ("cifar10_quick", 145_000, 146_000, 145_578),
    ("resnet20", 265_000, 275_000, None),
])
def test_parameter_counts(name, low, high, exact):
    channels, size = {"lenet": (1, 28), "cifar10_quick": (3, 32), "resnet20": (3, 32)}[name]
    count = n_params(build_model(name, channels, 10, size))
    assert low <= count <= high
    if exact is not None:  # the Caffe nets, layer for layer
        assert count == exact


def test_cifar10_quick_ends_on_a_4x4_map():
    model = build_model("cifar10_quick", 3, 10, 32)
    x = torch.randn(1, 3, 32, 32)
    for layer in model:
        if isinstance(layer, torch.nn.Flatten):
            break
        x = layer(x)
    assert x.shape == (1, 64, 4, 4)


def test_models_refuse_inputs_they_cannot_take():
    with pytest.raises(UsageError, match="lenet takes 28x28 images, got 32x32"):
        build_model("lenet", 3, 10, 32)
    with pytest.raises(UsageError, match="cifar10_quick takes 32x32 images, got 28x28"):
        build_model("cifar10_quick", 1, 10, 28)
    with pytest.raises(UsageError, match="at least 8x8"):
        build_model("resnet20", 3, 10, 4)
    with pytest.raises(UsageError, match="in_channels"):
        build_model("lenet", 0, 10, 28)
    with pytest.raises(UsageError, match="num_classes"):
        build_model("lenet", 1, 1, 28)


def test_unknown_model_lists_the_choices():
    with pytest.raises(UsageError, match="unknown model 'vgg16': use one of lenet, cifar10_quick, resnet20"):
        build_model("vgg16", 3, 10, 32)
    assert set(MODELS) == {"lenet", "cifar10_quick", "resnet20"}


@pytest.mark.parametrize("name,channels,size", [("lenet", 1, 28), ("cifar10_quick", 3, 32), ("resnet20", 3, 32)])
def test_init_is_fixed_by_the_seed(name, channels, size):
    def weights(seed):
        torch.manual_seed(seed)
        return torch.cat([p.detach().flatten() for p in build_model(name, channels, 10, size).parameters()])

    assert torch.equal(weights(1), weights(1))
    assert not torch.equal(weights(1), weights(2))


def test_default_models_fit_their_data_sets():
    assert [default_model(d) for d in ("digits", "mnist", "cifar10")] == ["lenet", "lenet", "cifar10_quick"]
    with pytest.raises(UsageError, match="imagenet"):
        default_model("imagenet")
    ds = load_dataset("digits")
    model = build_model(default_model("digits"), ds.in_channels, ds.num_classes, ds.image_size)
    assert model(ds.test_x[:4]).shape == (4, 10)

"""Model zoo: flax.linen models with `__call__(x, train=False, mask=None, embed=False)`.

They return logits, or with `embed=True` the input of the final Dense layer.

Use `get_model("name@width", num_classes=..., input_shape=...)`; see `registry` for the list
and the papers each architecture comes from, and `layers` for the CPU-fast convolution.
`register(name, builder, ...)` adds a model of your own to every model field of a config, the
way every built-in model is added; `entry(name)` is what the registry knows of a model.
"""

from fedjax_kd.models.cnn import CNN, DSFLCNN, DSFLFMNISTCNN
from fedjax_kd.models.fcn import FCN
from fedjax_kd.models.googlenet import GoogLeNet
from fedjax_kd.models.layers import BatchNorm, Conv, conv_im2col, conv_xla, max_pool2
from fedjax_kd.models.lenet import LeNet5
from fedjax_kd.models.mlp import MLP
from fedjax_kd.models.registry import (ModelEntry, available, count_params, entry, get_model,
                                       init_variables, parse_spec, register, unregister)
from fedjax_kd.models.resnet import (CifarResNet, resnet20, resnet32, resnet_l, resnet_m,
                                      resnet_s, resnet_t)
from fedjax_kd.models.resnet_imagenet import ResNet, resnet34, resnet50
from fedjax_kd.models.vgg import VGG, vgg11, vgg16

__all__ = [
    'BatchNorm', 'CNN', 'CifarResNet', 'Conv', 'DSFLCNN', 'DSFLFMNISTCNN', 'FCN', 'GoogLeNet',
    'LeNet5', 'MLP', 'ModelEntry', 'ResNet', 'VGG', 'available', 'conv_im2col', 'conv_xla',
    'count_params', 'entry', 'get_model', 'init_variables', 'max_pool2', 'parse_spec', 'register',
    'resnet20', 'unregister',
    'resnet32', 'resnet34', 'resnet50', 'resnet_l', 'resnet_m', 'resnet_s', 'resnet_t', 'vgg11',
    'vgg16',
]

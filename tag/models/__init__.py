"""Model zoo in plain PyTorch: the DNNs of the TAG, Parmesan and GraphPipe evaluations.

``get_model(name).build(tiny=..., batch_size=..., device=...)`` returns ``(model, example_inputs, loss_fn)``
with ``loss_fn(model(*example_inputs))`` a scalar, ready for tracing on the ``meta`` device.
"""

from tag.models.spec import ModelSpec
from tag.models.zoo import MODELS, get_model, list_models

__all__ = ["ModelSpec", "MODELS", "get_model", "list_models"]

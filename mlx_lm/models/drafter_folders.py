# Copyright © 2026 Apple Inc.

"""DeepSeek-V4 drafters split out of their checkpoint into a folder of their
own, in mlx-vlm's layouts, loaded beside a target whose conversion dropped
``mtp.*``: ``Model.load_drafter(path)`` (``--mtp PATH``).

- ``deepseek_v4_mtp`` (the MTP block): ``decoder.*`` (the block's decoder
  layer) and ``e_proj``, ``h_proj``, ``enorm``, ``hnorm``, ``hc_head``,
  ``norm`` at the top; loads as ``Model.mtp[0]``.
- ``deepseek_v4_dspark`` (V4-Flash-0731's, V4-Pro-0813's DSpark drafter):
  ``stages.N.*`` and the Markov head ``markov_head.*`` at the top (no
  confidence head); config ``n_mtp_layers``, ``target_layer_ids``,
  ``mask_token_id``, ``markov_rank``, ``block_size`` (drafts + 1); loads as
  ``Model.dspark``.

Both keep the target's whole config under ``text_config`` and their own
``quantization`` (per module, in the folder's names).
"""

import copy
import glob
import json
import re
from pathlib import Path
from typing import Dict, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .deepseek_v4_dspark import DSparkStage

MTP, DSPARK = "deepseek_v4_mtp", "deepseek_v4_dspark"
_MTP_TOP = ("e_proj.", "h_proj.", "enorm.", "hnorm.", "hc_head.", "norm.")
_STAGE = re.compile(r"stages\.(\d+)\.(.+)")
_HEADS = ("markov_head.", "confidence_head.")
# The folder's fields and the target's (block_size: the drafts + 1).
_DSPARK_FIELDS = (
    ("target_layer_ids", "dspark_target_layer_ids"),
    ("mask_token_id", "dspark_noise_token_id"),
    ("markov_rank", "dspark_markov_rank"),
    ("block_size", "dspark_block_size"),
)


def _layout(config: dict, keys) -> str:
    kind = config.get("model_type")
    if kind in (MTP, DSPARK):
        return kind
    if any(_STAGE.match(k) for k in keys):
        return DSPARK
    if any(k.startswith(("decoder.", *_MTP_TOP)) for k in keys):
        return MTP
    key = min(keys, default="(no weights)")
    raise ValueError(
        f"its weights fit neither the {MTP} layout (decoder.*, e_proj, ...) nor "
        f"{DSPARK}'s (stages.N.*, markov_head.*): {key!r}"
    )


def _name(layout: str, key: str, stages: int) -> Optional[str]:
    """The block's name of the folder's ``key``; None where it has none."""
    if layout == MTP:
        if key.startswith("decoder."):
            return "mtp.0." + key[len("decoder.") :]
        return "mtp.0." + key if key.startswith(_MTP_TOP) else None
    if match := _STAGE.fullmatch(key):
        return f"dspark.{match[1]}.{match[2]}"
    return f"dspark.{stages - 1}.{key}" if key.startswith(_HEADS) else None


def _dspark_args(args, config: dict, stages: int):
    """The target's args with the folder's DSpark fields where the target's
    config has none; a ValueError where the two disagree."""
    text = config.get("text_config") or {}
    folder = {}
    for field, target_field in _DSPARK_FIELDS:
        value = config.get(field)
        if value in (None, 0, []):
            value = text.get(target_field)
        elif field == "block_size":
            value -= 1
        if value is not None:
            folder[target_field] = value
    given = config.get("n_mtp_layers")
    if given is not None and given != stages:
        raise ValueError(f"its n_mtp_layers is {given}, its weights have {stages}")
    if not folder.get("dspark_target_layer_ids"):
        raise ValueError("its config has no target_layer_ids")
    args = copy.copy(args)
    if args.dspark_target_layer_ids:
        for field, value in folder.items():
            target = getattr(args, field)
            target = list(target) if isinstance(target, tuple) else target
            if target != value:
                raise ValueError(
                    f"its {field} ({value}) is not the target config's ({target})"
                )
    for field, value in folder.items():
        setattr(args, field, value)
    return args


def _quantize(container: nn.Module, weights: dict, quantization: dict):
    """Quantize the block's modules as the folder's were: its per-module
    entries, else as its weights are packed (``utils.infer_quant_config``)."""
    from ..utils import infer_quant_config

    def predicate(path, module):
        if path in quantization:
            return quantization[path]
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return infer_quant_config(path, module, weights)

    nn.quantize(
        container,
        group_size=quantization.get("group_size", 64),
        bits=quantization.get("bits", 4),
        mode=quantization.get("mode", "affine"),
        class_predicate=predicate,
    )


def _read(path: Path):
    with open(path / "config.json") as f:
        config = json.load(f)
    files = sorted(glob.glob(str(path / "*.safetensors")))
    if not files:
        raise ValueError("it has no .safetensors files")
    weights = {}
    for file in files:
        weights.update(mx.load(file))
    return config, weights


def load_drafter_folder(model: nn.Module, path, mtp_block, dspark_layers) -> nn.Module:
    """Load the drafter folder ``path`` (mlx-vlm's ``deepseek_v4_mtp`` or
    ``deepseek_v4_dspark`` layout) into the DeepSeek-V4 ``model`` as its own
    block (``model.mtp`` or ``model.dspark``, what ``mtp=True`` drafts with),
    quantized as the folder says: ``Model.load_drafter``, which gives its
    ``MTPBlock`` and the layers of a ``DSparkStage``. Raises a ValueError of
    one line naming the key (a name of neither layout; a shape the target's
    config does not give, with both shapes; one missing) and leaves the
    model as it was."""
    path = Path(path)
    try:
        config, weights = _read(path)
        layout = _layout(config, weights)
        stages = 1 + max(
            (int(m[1]) for k in weights if (m := _STAGE.match(k))), default=-1
        )
        names: Dict[str, str] = {}
        for key in weights:
            if key.endswith(".gate.bias_vl"):
                # mlx-vlm's vision routing bias; the routing does not read it.
                continue
            name = _name(layout, key, stages)
            if name is None:
                raise ValueError(f"{key!r} is not a name of the {layout} layout")
            names[name] = key
        quantization = config.get("quantization") or {}
        quantization = {
            (_name(layout, k + ".weight", stages) or k).removesuffix(".weight"): v
            for k, v in quantization.items()
        }
        args = model.args
        if layout == MTP:
            blocks = [mtp_block(args, args.num_hidden_layers)]
        else:
            args = _dspark_args(args, config, stages)
            blocks = [
                DSparkStage(args, i == 0, i == stages - 1, dspark_layers)
                for i in range(stages)
            ]
            if not any(".confidence_head." in name for name in names):
                # The split leaves the confidence head out.
                blocks[-1].pop("confidence_head")
        field = "mtp" if layout == MTP else "dspark"
        container = nn.Module()
        setattr(container, field, blocks)
        renamed = {name: weights[key] for name, key in names.items()}
        _quantize(container, renamed, quantization)
        wanted = dict(tree_flatten(container.parameters()))
        for name, key in names.items():
            if name not in wanted:
                raise ValueError(f"{key!r} ({name}) is not a weight of the block")
            shape, given = tuple(wanted[name].shape), tuple(weights[key].shape)
            if shape != given:
                raise ValueError(
                    f"{key!r} ({name}) has shape {given}, the target's config "
                    f"gives {shape}"
                )
        if missing := sorted(set(wanted) - set(names)):
            raise ValueError(f"it has no weight for the block's {missing[0]}")
        container.load_weights(list(renamed.items()))
        mx.eval(container.parameters())
    except (ValueError, OSError) as e:
        raise ValueError(f"Cannot load the drafter folder {path}: {e}") from None
    if layout == DSPARK:
        for _, target_field in _DSPARK_FIELDS:
            setattr(model.args, target_field, getattr(args, target_field))
        model.mtp, model.dspark = [], blocks
    else:
        model.mtp, model.dspark = blocks, []
    return model

"""The export faults users of block drafters meet most, injected into a checkpoint folder.

Each is a folder that an engine loads without a word but runs otherwise than the weights were
trained (see ``floorgap check``; ``workflow/scripts/served-faults.sh`` serves an exported
default drafter with each):

``layout-flipped``  the folder declares the other block layout (``sample_from_anchor``): 1+N
                    weights said to be anchor-first, or the reverse.
``taps-offset``     the target-layer ids one layer up: the features of layer L + 1 fed for L.
``fc-permuted``     the fusion's input columns of the first two taps swapped: the taps'
                    features in another order.
``mask-token``      the mask rows fed as another token: the trained mask embedding
                    (``mask_embedding.pt``) left out, so engines feed the target's embedding of
                    the mask token id; without one, the config's mask token id moved by one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["FAULTS", "inject_fault"]

FAULTS = ("layout-flipped", "taps-offset", "fc-permuted", "mask-token")


def _edit_config(folder: Path, key: str, change) -> None:
    """Apply ``change`` to ``key`` wherever the folder's config.json holds it (top level and
    ``dflash_config``)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for where in (config, config.get("dflash_config") or {}):
        if key in where:
            where[key] = change(where[key])
    path.write_text(json.dumps(config, indent=1))


def _swap_first_taps(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    taps = (config.get("dflash_config") or {}).get("target_layer_ids") \
        or config.get("target_layer_ids") or config.get("aux_hidden_state_layer_ids")
    tensors = load_file(str(folder / "model.safetensors"))
    fc = tensors["fc.weight"]
    blocks = list(fc.split(fc.shape[1] // len(taps), dim=1))
    blocks[0], blocks[1] = blocks[1], blocks[0]
    tensors["fc.weight"] = torch.cat(blocks, dim=1).contiguous()
    save_file(tensors, str(folder / "model.safetensors"))


def inject_fault(folder: str | Path, fault: str) -> None:
    """Inject ``fault`` (one of :data:`FAULTS`, module docstring) into the exported folder
    ``folder``, in place."""
    folder = Path(folder)
    if fault == "layout-flipped":
        config = json.loads((folder / "config.json").read_text())
        if config.get("sample_from_anchor") is None:
            raise ValueError(f"{folder}: config.json declares no layout to flip")
        _edit_config(folder, "sample_from_anchor", lambda v: not v)
    elif fault == "taps-offset":
        _edit_config(folder, "target_layer_ids", lambda ids: [int(t) + 1 for t in ids])
    elif fault == "fc-permuted":
        _swap_first_taps(folder)
    elif fault == "mask-token":
        mask = folder / "mask_embedding.pt"
        if mask.is_file():
            mask.unlink()
        else:
            _edit_config(folder, "mask_token_id", lambda t: int(t) - 1)
    else:
        raise ValueError(f"unknown fault {fault!r}; expected one of {FAULTS}")

"""A weight update from disk names a model folder on the server's disk, or is refused before SGLang touches it.

SGLang 0.5.23's `/update_weights_from_disk` (and `Engine.update_weights_from_disk`) hands `model_path` to
the scheduler's loader, which takes a path that is not a folder for a Hugging Face repo id:
`DefaultModelLoader._prepare_weights` calls `download_weights_from_hf`, whose `get_lock` creates
`<tempdir>/<sha256 of the path><the path, "/" as "-">.lock` before anything is downloaded, and leaves it
there whatever the download does (offline, or an id that is no repo id: `/etc/passwd`). Each request
with a made-up `model_path` left one more empty file in /tmp, named by the client (issue 85.6). The
loader had also set the model's `model_path` to the bad path before it failed.

The path must be an existing folder holding `config.json` (a checkpoint as `save_pretrained` writes it,
what a trainer hands a server between steps); anything else is answered as SGLang answers a failed update
(`success: false`, a 400 over HTTP) before the request reaches the scheduler. A weight update from the
Hub goes through a folder on disk too (`huggingface-cli download`).
"""

from __future__ import annotations

import os

CONFIG = "config.json"


def _shown(path: str) -> str:
    return repr(path if len(path) <= 200 else path[:200] + "...")


def path_error(model_path: object) -> str | None:
    """Why SGLang must not be handed this `model_path`; None if it names a model folder."""
    if not isinstance(model_path, str) or not model_path:
        return f"model_path must name a model folder on the server's disk, not {model_path!r}"
    if "\x00" in model_path or not os.path.isdir(model_path):
        return (f"model_path {_shown(model_path)} is not a folder on the server's disk: weights are updated "
                f"from a model folder (one holding {CONFIG} and the weight files)")
    if not os.path.isfile(os.path.join(model_path, CONFIG)):
        return f"model_path {_shown(model_path)} holds no {CONFIG}: it is not a model folder"
    return None

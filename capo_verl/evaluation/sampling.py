"""What sampling an evaluation means, whatever the engine: the settings (:class:`SamplingSettings`), one response
(:class:`Sample`, its ``lpm``), the per-question seed (:func:`question_seed`) and the prompt's token ids
(:func:`encode_prompt`, shared with the teacher-forced scoring)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math

from capo_verl.evaluation.problems import Problem

logger = logging.getLogger("capo_verl.evaluation")


@dataclasses.dataclass
class SamplingSettings:
    """How responses are sampled (paper section 5.1: k = 16, temperature 1.0)."""

    k: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 3046
    seed: int = 0

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k (samples per problem) must be >= 1, got {self.k}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclasses.dataclass
class Sample:
    """One sampled response: token ids (EOS included if reached), decoded text, per-token raw log-probs."""

    token_ids: list[int]
    text: str
    logprobs: list[float]
    truncated: bool

    @property
    def lpm(self) -> float:
        """Mean token log-probability in nats (float64 mean over ``logprobs``); NaN for an empty response."""
        return math.fsum(self.logprobs) / len(self.logprobs) if self.logprobs else float("nan")


def question_seed(seed: int, problem: Problem) -> int:
    """Per-question seed in [0, 2**63): stable across processes, machines and input order."""
    digest = hashlib.sha256(f"{seed}|{problem.data_source}|{problem.question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Chat messages -> prompt token ids with the tokenizer's chat template and the assistant header."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        logger.warning("tokenizer has no chat template: the prompt is the messages' contents joined by newlines")
        text = "\n".join(m["content"] for m in messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

"""A refused value's message carries a fix that works when pasted: the ``key=value`` it suggests passes the same
check (issue cases: ``simko.top_k=0``, ``simko.alpha=2``, ``timeout_s=-5``, ``val_calib=maybe``)."""

from __future__ import annotations

import re

import pytest

from capo_verl.compat.validation import parse_val_calib
from capo_verl.losses.simko import CONFIG_KEY, parse_simko_config
from capo_verl.reward import check_timeout


def suggested(message: str, key: str) -> str:
    """The value of the first ``[+]key=VALUE`` the message suggests."""
    match = re.search(rf"\+?{re.escape(key)}=([^\s;)]+)", message.split(": must", 1)[-1])
    assert match, message
    return match.group(1)


@pytest.mark.parametrize("name, bad", [("top_k", 0), ("alpha", 2.0), ("entropy_quantile", -0.5), ("top1_penalty", 0.0)])
def test_a_refused_simko_value_suggests_one_that_passes(name, bad):
    with pytest.raises(ValueError) as info:
        parse_simko_config({name: bad})
    message = str(info.value)
    assert message.startswith(f"{CONFIG_KEY}.{name} must") and f"got {bad}" in message
    value = suggested(message, f"{CONFIG_KEY}.{name}")
    parsed = parse_simko_config({name: int(value) if name == "top_k" else float(value)})
    assert getattr(parsed, name) == pytest.approx(float(value))


def test_a_refused_reward_timeout_suggests_one_that_passes():
    with pytest.raises(ValueError) as info:
        check_timeout(-5)
    value = suggested(str(info.value), "reward.custom_reward_function.reward_kwargs.timeout_s")
    check_timeout(float(value))  # the suggestion passes: no error
    assert float(value) == 10.0


def test_a_refused_val_calib_suggests_one_that_passes():
    with pytest.raises(ValueError) as info:
        parse_val_calib("maybe")
    value = suggested(str(info.value), "trainer.val_calib")
    assert value == "auto" and parse_val_calib(value) is None  # auto: measured where the dumps allow

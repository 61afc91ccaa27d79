#!/usr/bin/env bash
# GRPO twin of scripts/run_capo_smollm2_cpu.sh (configs/grpo_smollm2_135m_cpu.yaml); same arguments.
exec env CONFIG_NAME=grpo_smollm2_135m_cpu "$(dirname "$0")/run_capo_smollm2_cpu.sh" "$@"

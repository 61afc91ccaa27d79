"""The case list of run_cases.py (hostile round 4). ``define(h)`` registers every case with ``h.case`` / ``h.lib``."""

import gzip
import json
import os
from pathlib import Path

#: the shared data beside the checkout (../shared/data), or $CAPO_SHARED_DATA
SHARED = Path(os.environ.get("CAPO_SHARED_DATA", Path(__file__).resolve().parents[4] / "shared" / "data"))
DS = str(SHARED / "train" / "deepscaler_sub1209.parquet")
B = str(SHARED / "benchmarks")


def define(h):
    case, lib, FIX, cp, write_gen, gen_lines, scored = h.case, h.lib, h.FIX, h.cp, h.write_gen, h.gen_lines, h.scored
    S = "$CLI eval score --no-plots"
    TF = f"$CLI eval teacher-forced --device cpu --threads 1 --data {FIX}/data/gsm8k_calc_val.parquet"
    PD = "$CLI prepare-data --train-size 20 --val-size 5"
    GEN = "$CLI eval generate --model smollm2 --device cuda -k 2"  # --device cuda: stops before vLLM on this CPU

    # ================================================================ class 1: no command overwrites its input
    def s(d):
        scored(d)
        write_gen(d / "rep/metrics.json", gen_lines())  # a generation file at an owned name

    case("C1-01", 1, f"{S} x/../rep/metrics.json --out ./rep", "refuse", s, must="input")

    def s(d):
        scored(d)
        os.unlink(d / "rep/report.md")
        write_gen(d / "g.jsonl")
        os.link(d / "g.jsonl", d / "rep/report.md")

    case("C1-02", 1, f"{S} g.jsonl --out rep", "refuse", s, must="same file", note="input hard-linked at rep/report.md")

    def s(d):
        (d / "home").mkdir()
        scored(d / "home")
        write_gen(d / "home/rep/precision_coverage.png", gen_lines())

    case("C1-03", 1, f"{S} '~/rep/precision_coverage.png' --out '~/rep'", "refuse", s, must="input")

    def s(d):
        scored(d)
        os.symlink("rep", d / "alias")
        write_gen(d / "rep/accuracy_vs_auc.png", gen_lines())

    case(
        "C1-04",
        1,
        f"{S} rep/accuracy_vs_auc.png --out alias --overwrite",
        "refuse",
        s,
        must="input",
        note="--out a symlink to the folder owning the input's name",
    )

    def s(d):
        write_gen(d / "u/gen.jsonl")
        (d / "u/notes.txt").write_text("mine\n")

    case(
        "C1-05",
        1,
        f"{S} u/gen.jsonl --out u --overwrite",
        "ok",
        s,
        allow_change=("u/metrics.json",),
        note="input inside --out, not at an owned name: kept byte-identical",
    )

    def s(d):
        write_gen(d / "w/.capo-verl-lock.rep")

    case(
        "C1-06",
        1,
        f"{S} w/.capo-verl-lock.rep --out w/rep",
        "refuse",
        s,
        note="input at the name of the output's lock file",
    )

    def s(d):
        write_gen(d / "w/.capo-verl-new.rep/gen.jsonl")

    case(
        "C1-07",
        1,
        f"{S} w/.capo-verl-new.rep/gen.jsonl --out w/rep",
        "refuse",
        s,
        note="input inside the output's staging name",
    )

    def s(d):
        write_gen(d / "w/g.jsonl")
        (d / "w/.capo-verl-old.rep").mkdir()
        (d / "w/.capo-verl-old.rep/metrics.json").write_text('{"mine": 1}\n')
        scored(d / "w", "rep")

    case(
        "C1-08",
        1,
        f"{S} w/g.jsonl --out w/rep",
        "ok",
        s,
        note="user folder named like the old-folder sibling: kept",
        allow_change=("w/rep",),
    )
    case(
        "C1-09",
        1,
        f"{TF} --pool {{FIX}}/pool.jsonl --model {{FIX}}/tiny --out {{FIX}}/tiny/../tiny/config.json".replace(
            "{FIX}", str(FIX)
        ),
        "refuse",
        must="input",
        note="--out resolves to a file of the model folder",
    )

    def s(d):
        cp(FIX / "pool.jsonl", d / "pool.jsonl")
        os.symlink(d / "pool.jsonl", d / "res.0.npy")

    case(
        "C1-10",
        1,
        f"{TF} --pool pool.jsonl --model {FIX}/tiny --out res.json",
        "refuse",
        s,
        must="input",
        note="the lpm file res.0.npy is a symlink to the pool",
    )

    def s(d):
        cp(FIX / "data/gsm8k_calc_train.parquet", d / "train.parquet")
        os.link(d / "train.parquet", d / "t.json")

    case(
        "C1-11",
        1,
        f"$CLI mask-thresholds --model {FIX}/tiny --data train.parquet --pool {FIX}/pool.jsonl --out t.json",
        "refuse",
        s,
        must="same file",
        note="--out a hard link of --data",
    )

    def s(d):
        cp(FIX / "empty_rows.parquet", d / "data.parquet")
        os.symlink(d / "data.parquet", d / "o.prompts.parquet")

    case(
        "C1-12",
        1,
        "$CLI mask-thresholds --model smollm2 --data data.parquet --out o.json",
        "refuse",
        s,
        must="input",
        note="the prompts file the run writes is a symlink to --data (0-row data: stops before drawing)",
    )

    def s(d):
        (d / "bench").mkdir()
        cp(f"{B}/aime24.jsonl", d / "bench/aime24.jsonl")
        (d / "bench/aime24.parquet").write_bytes(b"PAR1 user PAR1")

    case(
        "C1-13",
        1,
        f"{PD} --no-train --benchmarks aime24 --benchmarks-dir bench --out-dir bench",
        "refuse",
        s,
        must="input",
        note="an output exists inside --benchmarks-dir",
    )

    def s(d):
        cp(DS, d / "out/deepscaler_train.parquet")

    case(
        "C1-14",
        1,
        f"{PD} --no-benchmarks --train-source out/../out/deepscaler_train.parquet --out-dir out",
        "refuse",
        s,
        must="input",
    )

    def s(d):
        cp(DS, d / "out/deepscaler_val.parquet")
        (d / "elsewhere").mkdir()
        os.symlink(d / "out/deepscaler_val.parquet", d / "elsewhere/src.parquet")

    case(
        "C1-15",
        1,
        f"{PD} --no-benchmarks --train-source elsewhere/src.parquet --out-dir out",
        "refuse",
        s,
        must="input",
    )

    def s(d):
        cp(DS, d / "home/capo_out/deepscaler_train.parquet")

    case(
        "C1-16",
        1,
        f"{PD} --no-benchmarks --train-source '~/capo_out/deepscaler_train.parquet' --out-dir '~/capo_out'",
        "refuse",
        s,
        must="input",
    )

    def s(d):
        cp(f"{B}/amc23.jsonl", d / "amc.jsonl")
        os.link(d / "amc.jsonl", d / "g.jsonl")

    case(
        "C1-17",
        1,
        f"{GEN} --data amc.jsonl --out g.jsonl --overwrite",
        "refuse",
        s,
        must="input",
        note="--out a hard link of --data",
    )
    case(
        "C1-18",
        1,
        f"{GEN} --benchmarks gsm8k --out {h.REPO}/capo_verl/resources/benchmarks/gsm8k_test.jsonl --overwrite",
        "refuse",
        must="input",
        note="--out the shipped benchmark file the run reads",
    )
    case(
        "C1-19",
        1,
        f"{GEN.replace('smollm2', str(FIX / 'tiny'))} --benchmarks amc23 --out {FIX}/tiny/model.safetensors --overwrite",  # noqa: E501
        "refuse",
        must="input",
        note="--out a weights file of --model",
    )
    case("C1-20", 1, f"{S} {FIX}/gen.jsonl --out {FIX}/gen.jsonl", "refuse", note="--out is the input file")

    def s(d):
        os.symlink("loop.json", d / "loop.json")

    case(
        "C1-21",
        1,
        f"$CLI mask-thresholds --model {FIX}/tiny --data {FIX}/data/gsm8k_calc_train.parquet --pool {FIX}/pool.jsonl --out loop.json",  # noqa: E501
        "refuse",
        s,
        must="loop",
    )

    def s(d):
        os.symlink("lp", d / "lp")

    case("C1-22", 1, f"{TF} --pool {FIX}/pool.jsonl --model {FIX}/tiny --out lp/res.json", "refuse", s, must="loop")

    def s(d):
        (d / "u").mkdir()
        (d / "u/notes.md").write_text("my notes\n")
        (d / "u/sub").mkdir()
        (d / "u/sub/x.bin").write_bytes(os.urandom(999))

    case("C1-23", 1, f"{S} {FIX}/gen.jsonl --out u", "refuse", s, note="a user's non-empty folder, no --overwrite")

    def s(d):
        (d / "u").mkdir()
        (d / "u/report.md").write_text("user's own report\n")
        (d / "u/keep.txt").write_text("k\n")
        (d / "u/sub").mkdir()
        (d / "u/sub/x.bin").write_bytes(os.urandom(999))
        os.mkfifo(d / "u/fifo")

    case(
        "C1-24",
        1,
        f"{S} {FIX}/gen.jsonl --out u --overwrite",
        "ok",
        s,
        allow_change=("u/report.md",),
        note="--overwrite replaces only owned names; keep.txt, sub/, a FIFO kept",
    )
    case("C1-25", 1, f"{PD} --no-train --no-benchmarks --out-dir o", "refuse", must="nothing to write")
    case("C1-26", 1, f"{PD} --no-train --benchmarks aime24,nope --out-dir o", "refuse", must="nope")

    def s(d):
        (d / "o").write_text("a file\n")

    case("C1-27", 1, f"{PD} --no-train --benchmarks aime24 --out-dir o", "refuse", s)

    def s(d):
        cp(FIX / "gen.jsonl", d / "g.jsonl")

    case("C1-28", 1, f"{S} g.jsonl --out g.jsonl/rep", "refuse", s, note="--out under a file")

    # ================================================================ class 2: whole or untouched, one writer
    HOLD = (
        f"{h.PY} -c \"import time,sys; from capo_verl.outputs import Outputs; o=Outputs('test holder'); "
        "f=o.folder('--out', sys.argv[1], owns=['metrics.json']); o.check(); w=o.writing(); w.__enter__(); "
        "print('held', flush=True); time.sleep(40)\" {out} > hold.log 2>&1 & HP=$!; "
        "for i in $(seq 100); do grep -q held hold.log 2>/dev/null && break; sleep 0.1; done; "
    )

    def chk_pid(d, out):
        pid = (d / "hold.pid").read_text().strip() if (d / "hold.pid").exists() else "?"
        return None if f"PID {pid}" in out else f"PASSED-WRONGLY: message does not name holder PID {pid}"

    case(
        "C2-01",
        2,
        HOLD.format(out="rep") + f"echo $HP > hold.pid; {S} {FIX}/gen.jsonl --out rep; rc=$?; kill $HP; exit $rc",
        "refuse",
        note="second writer refused naming the first PID",
        setup=lambda d: scored(d),
        check=chk_pid,
    )
    case(
        "C2-02",
        2,
        HOLD.format(out="o.json")
        + f"echo $HP > hold.pid; {TF} --pool {FIX}/pool.jsonl --model {FIX}/tiny --out o.json; rc=$?; kill $HP; exit $rc",  # noqa: E501
        "refuse",
        check=chk_pid,
        note="teacher-forced into an --out another process holds",
    )
    case(
        "C2-03",
        2,
        HOLD.format(out="m.json")
        + f"echo $HP > hold.pid; $CLI mask-thresholds --model {FIX}/tiny --data {FIX}/data/gsm8k_calc_train.parquet --pool {FIX}/pool.jsonl --out m.json; rc=$?; kill $HP; exit $rc",  # noqa: E501
        "refuse",
        check=chk_pid,
        note="mask-thresholds into a held --out",
    )

    def s(d):
        scored(d)
        (d / ".capo-verl-lock.rep").write_text('{"pid": 999999, "command": "capo-verl eval score"}\n')

    case(
        "C2-04",
        2,
        f"{S} {FIX}/gen.jsonl --out rep",
        "ok",
        s,
        allow_change=("rep", ".capo-verl-lock.rep"),
        note="a dead writer's lock file is taken over",
        check=lambda d, o: None if not (d / ".capo-verl-lock.rep").exists() else "LOST-DATA: lock left",
    )

    def s(d):
        scored(d)
        (d / ".capo-verl-new.rep").mkdir()
        (d / ".capo-verl-new.rep/metrics.json").write_text("half\n")

    case(
        "C2-05",
        2,
        f"{S} {FIX}/gen.jsonl --out rep",
        "ok",
        s,
        allow_change=(".capo-verl-new.rep", "rep"),
        note="a killed run's staging folder is cleared, rep replaced whole",
        check=lambda d, o: (
            None if json.loads((d / "rep/metrics.json").read_text()).get("gen") else "LOST-DATA: rep not new"
        ),
    )

    def s(d):
        scored(d)
        (d / ".capo-verl-commit.rep.json").write_text("{not json")

    case(
        "C2-06",
        2,
        f"{S} {FIX}/gen.jsonl --out rep",
        "refuse",
        s,
        note="an unreadable commit journal: stop, change nothing",
    )

    def chk_tf(d, out):
        a = json.loads((d / "o.json").read_text())
        return None if (d / "o.0.npy").exists() and "models" in a else "LOST-DATA: outputs incomplete"

    case(
        "C2-07",
        2,
        f"{TF} --pool {FIX}/pool.jsonl --model {FIX}/tiny --out o.json && {TF} --pool {FIX}/pool.jsonl --model {FIX}/tiny --out o.json",  # noqa: E501
        "ok",
        check=chk_tf,
        note="teacher-forced twice into one --out (tiny model, 4 responses)",
        timeout=240,
    )

    # ================================================================ class 3: every key typed is read or refused
    R15 = "bash {REPO}/scripts/run_{m}_qwen2.5_math_1.5b.sh --dry-run".replace("{REPO}", str(h.REPO))
    R7 = "bash {REPO}/scripts/run_{m}_qwen2.5_math_7b.sh --dry-run".replace("{REPO}", str(h.REPO))
    CPU = f"bash {h.REPO}/scripts/run_capo_smollm2_cpu.sh --dry-run"

    def dry(id, cls, script, args, expect="refuse", must=None, note="", env=None, setup=None, check=None):
        case(id, cls, f"{script} {args}", expect, setup, must=must, note=note, env=env, check=check, timeout=180)

    dry("C3-01", 3, R15.format(m="grpo"), "+algorithm.capo.ref_low=2.0", must="algorithm.capo")
    dry("C3-02", 3, R15.format(m="capo"), "algorithm.capo.taue=0.5", must="taue")
    dry("C3-03", 3, R15.format(m="capo"), "+algorithm.capo.ref_hi=3", must="ref_hi")
    dry("C3-04", 3, R15.format(m="codapo"), "+algorithm.capo.tau=0.5", must="algorithm.capo")
    dry("C3-05", 3, R15.format(m="simko"), "ablation=tau0.4", must="ablation")
    dry(
        "C3-06",
        3,
        R15.format(m="capo"),
        "ablation=tau0.4 algorithm.capo.tau=0.9",
        note="run named _tau0.4 would train tau 0.9",
    )
    dry("C3-07", 3, R15.format(m="capo"), "ablation=Tau0.4", must="Tau0.4")
    dry("C3-08", 3, R15.format(m="grpo"), "+actor_rollout_ref.actor.policy_loss.simko.top_k=5", must="simko")
    dry("C3-09", 3, R15.format(m="simko"), "actor_rollout_ref.actor.policy_loss.simko.topk=5", must="topk")
    dry(
        "C3-10",
        3,
        R15.format(m="cde"),
        "algorithm.cde.w_zero_after_step=10 trainer.use_v1=false",
        must="w_zero_after_step",
    )
    dry("C3-11", 3, R15.format(m="capo"), "trainer.val_calib=maybe", must="val_calib")
    dry("C3-12", 3, R15.format(m="capo"), "+reward.custom_reward_function.reward_kwargs.timeout=30", must="timeout")
    dry("C3-13", 3, R15.format(m="capo"), "+adv_esimator=grpo", must="adv_esimator")
    dry("C3-14", 3, R15.format(m="capo"), "algorithm.adv_estimator=capo_mask", must="capo_mask")
    dry("C3-15", 3, R15.format(m="capo"), "+actor_rollout_ref.rollout.temprature=0.7", must="temprature")
    dry(
        "C3-16",
        3,
        R15.format(m="capo"),
        "algorithm.capo.use_mask=false algorithm.capo.ref_low=3.0",
        note="ref_low typed, read by nothing with the mask off",
    )
    dry(
        "C3-17",
        3,
        R15.format(m="capo"),
        "algorithm.adv_estimator=grpo_mask algorithm.capo.tau=0.3",
        note="tau typed, grpo_mask does not read it",
    )
    dry("C3-18", 3, R7.format(m="gspo"), "+algorithm.codapo.resample=true", must="codapo")
    dry("C3-19", 3, R15.format(m="capo"), "+algorithm.capo.tau=0.5", note="+ on a key the config has")
    dry("C3-20", 3, R15.format(m="capo"), "algorithm.capo.normalize=group", expect="ok", note="control")
    dry("C3-21", 3, CPU, "trainer.val_before_train=yes", must="val_before_train")
    dry("C3-22", 3, CPU, "--dryrun", must="dryrun")
    dry("C3-23", 3, R15.format(m="capo"), "+algorithm.cde.kappa=2", must="cde")
    dry("C3-24", 3, R15.format(m="grpo"), "+actor_rollout_ref.actor.use_dynamic_bsz=false", note="+ on a key verl has")

    # ================================================================ class 4: GPU layouts
    dry("C4-01", 4, R15.format(m="capo"), "", env={"N_GPUS_PER_NODE": "6"}, must="n_gpus_per_node")
    dry("C4-02", 4, R15.format(m="capo"), "", env={"N_GPUS_PER_NODE": "0"}, must="n_gpus_per_node")
    dry("C4-03", 4, R7.format(m="capo"), "", env={"NNODES": "3"}, must="n_gpus_per_node")
    dry("C4-04", 4, R15.format(m="grpo"), "", env={"N_GPUS_PER_NODE": "8a"})
    dry("C4-05", 4, R15.format(m="grpo"), "", env={"NNODES": "-1"}, must="nnodes")
    dry(
        "C4-06",
        4,
        R7.format(m="grpo"),
        "actor_rollout_ref.rollout.tensor_model_parallel_size=8",
        env={"N_GPUS_PER_NODE": "4"},
    )
    dry(
        "C4-07",
        4,
        R15.format(m="grpo"),
        "",
        env={"N_GPUS_PER_NODE": "16"},
        expect="ok",
        note="control: 16 ranks divide the batch",
    )
    dry("C4-08", 4, R15.format(m="codapo"), "", env={"N_GPUS_PER_NODE": "12"}, must="n_gpus_per_node")
    dry("C4-09", 4, R15.format(m="capo"), "", env={"N_GPUS_PER_NODE": "1.5"})
    dry("C4-10", 4, R15.format(m="capo"), "trainer.n_gpus_per_node=5", note="override after the script's own value")

    # ================================================================ class 5: model vs data vs thresholds
    TRAIN, VAL = FIX / "data/gsm8k_calc_train.parquet", FIX / "data/gsm8k_calc_val.parquet"
    LOCAL = f"data.train_files={TRAIN} data.val_files={VAL} data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 trainer.total_training_steps=2 data.max_prompt_length=256"  # noqa: E501
    dry(
        "C5-01",
        5,
        R15.format(m="capo"),
        LOCAL,
        env={"CAPO_MODEL_1_5B": str(FIX / "tiny")},
        must="max_position_embeddings",
        note="prompt+response lengths over the tiny model's 1024 positions",
    )

    def s(d):
        cp(FIX / "tiny", d / "m")
        os.unlink(d / "m/config.json")

    dry(
        "C5-02",
        5,
        R15.format(m="capo"),
        LOCAL,
        "ok",
        env={"CAPO_MODEL_1_5B": "{D}/m"},
        setup=s,
        note="warned, not refused: the dry run names a model folder without config.json (docs/reproducing.md)",
    )
    dry(
        "C5-03",
        5,
        R15.format(m="capo"),
        LOCAL,
        "ok",
        env={"CAPO_MODEL_1_5B": str(FIX / "tiny/model.safetensors")},
        note="warned, not refused: the dry run names a model path that is no model folder",
    )

    def s(d):
        cp(FIX / "tiny", d / "m")
        c = json.loads((d / "m/config.json").read_text())
        c["vocab_size"] = 100
        (d / "m/config.json").write_text(json.dumps(c))

    dry(
        "C5-04",
        5,
        R15.format(m="capo"),
        LOCAL + " data.max_response_length=256",
        env={"CAPO_MODEL_1_5B": "{D}/m"},
        setup=s,
        must="vocab",
    )

    def s(d):
        cp(FIX / "tiny", d / "m")
        c = json.loads((d / "m/config.json").read_text())
        c["max_position_embeddings"] = "lots"
        (d / "m/config.json").write_text(json.dumps(c))

    dry(
        "C5-05",
        5,
        R15.format(m="capo"),
        LOCAL + " data.max_response_length=256",
        env={"CAPO_MODEL_1_5B": "{D}/m"},
        setup=s,
        note="config.json with a string max_position_embeddings",
    )

    def s(d):
        cp(FIX / "tiny", d / "m")
        (d / "m/config.json").write_text('{"model_type": "qwen2", ')

    dry(
        "C5-06",
        5,
        R15.format(m="capo"),
        LOCAL + " data.max_response_length=256",
        env={"CAPO_MODEL_1_5B": "{D}/m"},
        setup=s,
        must="config.json",
        note="config.json cut short",
    )
    dry(
        "C5-07",
        5,
        R15.format(m="capo"),
        LOCAL + " data.max_response_length=256 data.max_prompt_length=8",
        env={"CAPO_MODEL_1_5B": str(FIX / "tiny")},
        must="max_prompt_length",
    )
    dry(
        "C5-08",
        5,
        R15.format(m="capo"),
        f"data.train_files={FIX}/noprompt.parquet data.val_files={VAL} data.max_response_length=256 data.max_prompt_length=256",  # noqa: E501
        env={"CAPO_MODEL_1_5B": str(FIX / "tiny")},
        must="prompt",
    )
    dry(
        "C5-09",
        5,
        R15.format(m="capo"),
        f"data.train_files={DS} data.val_files={VAL} data.train_batch_size=2048 data.max_response_length=256 data.max_prompt_length=256",  # noqa: E501
        env={"CAPO_MODEL_1_5B": str(FIX / "tiny")},
        must="train_batch_size",
    )
    dry("C5-10", 5, R15.format(m="capo"), "algorithm.capo.ref_high=0.5", must="ref_high")
    case(
        "C5-11",
        5,
        f"$CLI mask-thresholds --model {FIX}/tiny --data {FIX}/data/gsm8k_calc_val.parquet --pool {FIX}/pool_allcorrect.jsonl --out t.json",  # noqa: E501
        "refuse",
        must="correct",
        note="a pool with no incorrect response",
    )
    case(
        "C5-12",
        5,
        f"$CLI mask-thresholds --model {FIX}/tiny --data {FIX}/data/gsm8k_calc_train.parquet --pool {FIX}/pool.jsonl --out t.json",  # noqa: E501
        "refuse",
        note="pool questions not in --data (they are val rows)",
    )
    case(
        "C5-13",
        5,
        f"$CLI mask-thresholds --model {FIX}/tiny --data {FIX}/data/gsm8k_calc_val.parquet --pool {FIX}/pool.jsonl --out t.json --n-boot 50",  # noqa: E501
        "ok",
        note="control: tiny model, 4 responses",
        timeout=200,
    )

    # ================================================================ class 6: paths, numbers, data files
    dry(
        "C6-01",
        6,
        R15.format(m="capo"),
        "",
        env={"CAPO_DATA_DIR": "{D}/d,a=t a"},
        expect="ok",
        check=lambda d, o: (
            None if f"{d}/d,a=t a/deepscaler_train.parquet" in o else "PASSED-WRONGLY: path not in the resolved config"
        ),
    )
    dry(
        "C6-02",
        6,
        R15.format(m="capo"),
        "",
        env={"CAPO_CKPT_DIR": "{D}/ck'pt é ü"},
        expect="ok",
        check=lambda d, o: None if "pt é ü/" in o else "PASSED-WRONGLY: path changed",
    )
    dry(
        "C6-03",
        6,
        R15.format(m="grpo"),
        "",
        env={"CAPO_DATA_DIR": "~/da ta"},
        expect="ok",
        check=lambda d, o: (
            None if f"{d}/home/da ta/deepscaler_train.parquet" in o else "PASSED-WRONGLY: ~ not expanded"
        ),
    )
    dry(
        "C6-04",
        6,
        R15.format(m="grpo"),
        "",
        env={"CAPO_CKPT_DIR": "{D}/${oc.env:HOME}"},
        expect="ok",
        check=lambda d, o: None if "${oc.env:HOME}/" in o else "PASSED-WRONGLY: ${...} interpolated",
    )

    def s(d):
        os.mkfifo(d / "f.parquet")

    dry(
        "C6-05",
        6,
        R15.format(m="capo"),
        "data.train_files={D}/f.parquet".replace("{D}", "$D"),
        setup=s,
        must="f.parquet",
    )
    dry("C6-06", 6, R15.format(m="capo"), "data.train_files=[]", must="train_files")

    def s(d):
        with open(d / "sparse.parquet", "wb") as f:
            f.write(b"PAR1")
            f.seek(2**31)
            f.write(b"PAR1")

    dry("C6-07", 6, R15.format(m="capo"), "data.val_files=$D/sparse.parquet", setup=s, must="sparse")
    case("C6-08", 6, f"{S} e.jsonl --out r", "refuse", lambda d: (d / "e.jsonl").write_bytes(b""))
    case("C6-09", 6, f"{S} f.jsonl --out r", "refuse", lambda d: os.mkfifo(d / "f.jsonl"), timeout=30)

    def s(d):
        with open(d / "sparse.jsonl", "wb") as f:
            f.write(b'{"a": 1}\n')
            f.seek(3 * 2**20)
            f.write(b"\n")

    case("C6-10", 6, f"{S} sparse.jsonl --out r", "refuse", s, must="sparse")
    case(
        "C6-11",
        6,
        f"{S} u16.jsonl --out r",
        "refuse",
        lambda d: (d / "u16.jsonl").write_bytes("".join(json.dumps(x) + "\n" for x in gen_lines()).encode("utf-16")),
    )

    def s(d):
        raw = gzip.compress("".join(json.dumps(x) + "\n" for x in gen_lines(n_q=30)).encode())
        (d / "cut.jsonl.gz").write_bytes(raw[: len(raw) // 2])

    case("C6-12", 6, f"{S} cut.jsonl.gz --out r", "refuse", s, must="cut.jsonl.gz", note="a gzip file cut short")

    def s(d):
        raw = bytearray(gzip.compress("".join(json.dumps(x) + "\n" for x in gen_lines(n_q=30)).encode()))
        for i in range(20, len(raw) - 20, 7):
            raw[i] ^= 0x5A
        (d / "bad.jsonl.gz").write_bytes(bytes(raw))

    case(
        "C6-13",
        6,
        f"{S} bad.jsonl.gz --out r",
        "refuse",
        s,
        must="bad.jsonl.gz",
        note="a gzip file with a corrupt body",
    )

    def s(d):
        write_gen(d / "g.jsonl")
        (d / "g.jsonl.meta.json").write_text("[1, 2]\n")

    case(
        "C6-14",
        6,
        f"{S} g.jsonl --out r",
        "refuse",
        s,
        must="meta.json",
        note="its .meta.json is a JSON list: named",
    )

    def s(d):
        write_gen(d / "g.jsonl")
        (d / "g.jsonl.meta.json").write_text('{"wall_s": "12"}\n')

    case("C6-15", 6, f"{S} g.jsonl --out r", "refuse", s, must="wall_s", note="its .meta.json has wall_s as a string")

    def s(d):
        write_gen(d / "g.jsonl")
        os.mkfifo(d / "g.jsonl.meta.json")

    case("C6-16", 6, f"{S} g.jsonl --out r", "refuse", s, must="FIFO", timeout=30, note="its .meta.json is a FIFO")

    def s(d):
        L = gen_lines()
        L[2]["lpm"] = "-1.0"
        write_gen(d / "g.jsonl", L)

    case("C6-17", 6, f"{S} g.jsonl --out r", "refuse", s, must="g.jsonl:3")

    def s(d):
        L = gen_lines()
        L[1]["question_id"] = "0"
        L[1]["sample_index"] = 0
        write_gen(d / "g.jsonl", L)

    case("C6-18", 6, f"{S} g.jsonl --out r", "refuse", s, must="duplicate", note='question_id 0 and "0" same sample')

    def s(d):
        (d / "t.jsonl").write_text(
            '{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "answer": "4"}\n{"problem": oops}\n'
        )

    case("C6-19", 6, f"{PD} --no-benchmarks --train-source t.jsonl --out-dir o", "refuse", s, must="t.jsonl:3")
    case(
        "C6-20",
        6,
        f"{PD} --no-benchmarks --train-source t.csv --out-dir o",
        "refuse",
        lambda d: (d / "t.csv").write_text("problem,answer\n1+1,2\n"),
        must="t.csv",
    )
    case(
        "C6-21",
        6,
        f"{PD} --no-benchmarks --train-source srcdir --out-dir o",
        "refuse",
        lambda d: (d / "srcdir").mkdir(),
        must="srcdir",
    )
    case("C6-22", 6, f"{PD} --no-benchmarks --train-source /dev/zero --out-dir o", "refuse", timeout=30)
    case(
        "C6-23",
        6,
        f"{PD} --no-benchmarks --train-source junk.parquet --out-dir o",
        "refuse",
        lambda d: (d / "junk.parquet").write_bytes(b"PAR1" + os.urandom(5000) + b"PAR1"),
        must="junk.parquet",
    )
    case(
        "C6-24",
        6,
        f"$CLI prepare-data --no-benchmarks --train-source {DS} --train-size 2000 --val-size 5 --out-dir o",
        "refuse",
        must="train",
        note="more training problems than the source has",
    )
    case("C6-25", 6, f"{PD} --no-benchmarks --train-source {DS} --seed 1.5 --out-dir o", "refuse", must="seed")
    case("C6-26", 6, f"{S} --generations 'a=' --out r", "refuse")
    case("C6-27", 6, f"{S} a={FIX}/gen.jsonl a={FIX}/gen.jsonl --out r", "refuse", must="twice")
    case(
        "C6-28",
        6,
        f"{TF} --pool {FIX}/pool.jsonl --model {FIX}/tiny --out o.json --batch-size -3",
        "refuse",
        must="batch",
    )
    case(
        "C6-29",
        6,
        f"$CLI mask-thresholds --model {FIX}/tiny --data {FIX}/data/gsm8k_calc_val.parquet --pool {FIX}/pool.jsonl --out t.json --temperature nan",  # noqa: E501
        "refuse",
        must="temperature",
    )
    case(
        "C6-30",
        6,
        f"$CLI mask-thresholds --model {FIX}/tiny --data {FIX}/data/gsm8k_calc_val.parquet --pool {FIX}/pool.jsonl --out t.json --n-boot 0",  # noqa: E501
        "refuse",
        must="n-boot",
    )
    case("C6-31", 6, "$CLI demo --tau 1e-45", "refuse", must="tau")
    case("C6-32", 6, "$CLI demo --tau nan", "refuse", must="tau")

    def s(d):
        with open(d / "long.jsonl", "wb") as f:
            f.write(b'{"x": "' + b"a" * (17 * 2**20) + b'"}\n')

    case("C6-33", 6, f"{S} long.jsonl --out r", "refuse", s, must="long.jsonl:1")
    case(
        "C6-34",
        6,
        f"{TF} --pool {FIX}/pool.jsonl --model {FIX}/tiny --out 'ü ,=x/o.json' && test -f 'ü ,=x/o.0.npy'",
        "ok",
        timeout=200,
        note="non-ASCII, comma, = and space in --out",
    )
    case("C6-35", 6, f"{GEN} --data {FIX}/gen.jsonl --out g.jsonl --threads 0", "refuse", must="threads")

    # ================================================================ library: estimators and metrics
    lib(
        "L01",
        6,
        "capo_pairwise_advantages(torch.tensor([float('nan'),-1.,-1.,-2.]), c, v, gid, 2, 0.6)",
        "raise",
        must="lpm",
        note="NaN lpm on a valid row",
    )
    lib(
        "L02",
        6,
        "capo_pairwise_advantages(torch.tensor([-float('inf'),-float('inf'),-1.,-2.]), c, v, gid, 2, 0.6)",
        "raise",
        must="lpm",
    )
    lib(
        "L03",
        6,
        "capo_pairwise_advantages(lpm, c, v, torch.tensor([0,0,5,5]), 2, 0.6)",
        "raise",
        must="gid",
        note="gid beyond n_groups",
    )
    lib("L04", 6, "capo_pairwise_advantages(lpm, c, v, torch.tensor([0,0,-1,-1]), 2, 0.6)", "raise", must="gid")
    lib(
        "L05",
        6,
        "capo_pairwise_advantages(lpm[:3], c, v, gid, 2, 0.6)",
        "raise",
        must="lpm",
        note="lpm of 3 rows, 4 others",
    )
    lib(
        "L06", 6, "capo_pairwise_advantages(lpm, torch.tensor([0.7,0.,1.,0.]), v, gid, 2, 0.6)", "raise", must="correct"
    )
    lib("L07", 6, "capo_pairwise_advantages(lpm, c, v, gid, 0, 0.6)", "raise", must="n_groups")
    lib("L08", 6, "capo_pairwise_advantages(lpm, c, v, gid, 2, 0.6, normalize='Group')", "raise", must="normalize")
    lib("L09", 6, "capo_pairwise_advantages(lpm.to(torch.complex64), c, v, gid, 2, 0.6)", "raise", must="complex")
    lib("L10", 6, "capo_pairwise_advantages(-lpm, c, v, gid, 2, 0.6)", "raise", must="lpm", note="positive log-probs")
    lib("L11", 6, "cde_advantages(c, lpm, gid, 2, 1.0, kappa=0.0)", "raise", must="kappa")
    lib("L12", 6, "cde_advantages(c, lpm, gid, 2, 1.0, alpha=-1.0)", "raise", must="alpha")
    lib("L13", 6, "cde_advantages(c, lpm, gid, 2, float('nan'))", "raise", must="w")
    lib("L14", 6, "cde_advantages(c, torch.tensor([float('nan'),-3.,-1.,-2.]), gid, 2, 1.0)", "raise", must="lpm")
    lib("L15", 6, "codapo_group_weights(lpm, c, gid, 2, weight_offset=-5.0)", "raise", must="weight_offset")
    lib("L16", 6, "codapo_group_weights(torch.tensor([float('nan'),-3.,-1.,-2.]), c, gid, 2)", "raise", must="lpm")
    lib("L17", 6, "codapo_group_weights(-lpm, c, gid, 2)", "raise", must="lpm")
    lib("L18", 6, "reference_ppl_mask(torch.tensor([float('nan'),2.,2.,2.]), c, 2.5, 1.05)", "raise", must="ref_ppl")
    lib(
        "L19",
        6,
        "reference_ppl_mask(torch.tensor([1.5,2.,2.,2.]), c, 1.05, 2.5)",
        "raise",
        must="ref_",
        note="ref_high < ref_low",
    )
    lib("L20", 6, "reference_ppl_mask(torch.tensor([0.5,2.,2.,2.]), c, 2.5, 1.05)", "raise", must="ref_ppl")
    lib(
        "L21",
        6,
        "grpo_group_advantages(torch.tensor([1.,1.,0.,1.]), gid, 2, True, 0.0)",
        "ok",
        note="epsilon 0: a constant group gets exactly 0 (as documented), the other its z-scores",
    )
    lib("L22", 6, "group_ids(np.array(['a','b','c']), 4)", "raise", must="uid")
    lib(
        "L23",
        6,
        "M.auc_mean([-1.,-2.,-1.,-2.], ['no','yes','no','yes'], [0,0,1,1])",
        "raise",
        must="correct",
        note="correct as strings",
    )
    lib(
        "L24",
        6,
        "M.auc_mean([-1.,-2.,-1.,-2.], [0.3,0.9,0.2,1.0], [0,0,1,1])",
        "raise",
        must="correct",
        note="correct as probabilities (docs: bool or 0/1)",
    )
    lib("L25", 6, "M.auc_mean([-1.,-2.,-1.,-2.], [float('nan'),0,1,0], [0,0,1,1])", "raise", must="correct")
    lib("L26", 6, "M.auc_mean(np.array([-1+1j,-2,-1,-2]), [1,0,1,0], [0,0,1,1])", "raise", must="scores")
    lib("L27", 6, "M.precision_at_coverage([-1.,-2.,-3.], [1,0,1], levels=[float('nan')])", "raise", must="levels")
    lib("L28", 6, "M.pass_at_k([1,0,1,0], [0,0,1,1], 1.5)", "raise", must="k")
    lib("L29", 6, "M.auc_mean([-1.,-2.,-1.], [1,0,1,0], [0,0,1,1])", "raise", must="length")
    lib("L30", 6, "M.its_accuracy([0,0], ['1','2'], [5.0,-2.], [1,0])", "raise", must="lpm", note="positive lpm")
    lib(
        "L31",
        6,
        "compute_capo_outcome_advantage(R, MASK.half(), IDX, CFG, old_log_probs=OLP, ref_log_prob=REF)[0][:,0]",
        "ok",
        note="float16 0/1 mask",
    )
    lib(
        "L32",
        6,
        "compute_capo_outcome_advantage(R, MASK*-1, IDX, CFG, old_log_probs=OLP, ref_log_prob=REF)",
        "raise",
        must="response_mask",
    )
    lib(
        "L33",
        6,
        "compute_capo_outcome_advantage(R, MASK, IDX[:3], CFG, old_log_probs=OLP, ref_log_prob=REF)",
        "raise",
        must="uid",
    )
    lib(
        "L34",
        6,
        "compute_capo_outcome_advantage(R.to(torch.complex64), MASK, IDX, CFG, old_log_probs=OLP, ref_log_prob=REF)",
        "raise",
        must="complex",
    )
    lib(
        "L35",
        6,
        "compute_capo_outcome_advantage(R, MASK, IDX, CFG, old_log_probs=OLP.numpy(), ref_log_prob=REF)",
        "raise",
        must="old_log_probs",
    )
    lib(
        "L36",
        6,
        "compute_capo_outcome_advantage(R, MASK, IDX, CFG, old_log_probs=OLP, ref_log_prob=-REF)",
        "raise",
        must="ref_log_prob",
        note="ref PPL < 1",
    )
    lib(
        "L37",
        6,
        "compute_capo_outcome_advantage(R, MASK, IDX, {'capo': {'tua': 0.5}}, old_log_probs=OLP, ref_log_prob=REF)",
        "raise",
        must="tua",
    )
    lib(
        "L38",
        6,
        "compute_cde_outcome_advantage(R, MASK, IDX, OmegaConf.create({'cde': {'alpha': float('inf')}}), old_log_probs=OLP)",  # noqa: E501
        "raise",
        must="alpha",
    )
    lib(
        "L39",
        6,
        "compute_codapo_outcome_advantage(R, MASK, IDX, OmegaConf.create({'codapo': {}}), old_log_probs=OLP, rollout_log_probs=OLP[:, :2])",  # noqa: E501
        "ok",
        note="rollout_log_probs of the wrong shape, unused beside old_log_probs: not read",
    )
    lib(
        "L40",
        6,
        "compute_grpo_mask_outcome_advantage(R, MASK, IDX, CFG, ref_log_prob=REF[:, :2])",
        "raise",
        must="ref_log_prob",
    )

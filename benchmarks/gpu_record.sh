#!/usr/bin/env bash
# The GPU record in one call (a lent GPU is held for minutes, so everything runs in one go):
#   1. the PyTorch references with their own code (../shared/anchors/bench_pytorch_refs.py, with
#      self-critical.pytorch in .anchors/sc and the official AAT in .anchors/aat);
#   2. the jaxcap rows compiled into a persistent compilation cache by one process per precompile
#      group, all groups at once (fewer groups with ONLY; their number is written to
#      precompile_processes): their compile seconds are kept, compile time under that concurrency;
#   3. the timed rows, one process at a time, in order of importance, each phase under a
#      deadline so that a slow phase cuts only its own tail, train.py's loop fed from .npz files
#      among them (input_pipeline.py, grain and ml_collections from wheels in .whl/ where the
#      image lacks them);
#   4. everything packed into $OUT/records.tgz (benchmarks/results/ gets the JSONs from there).
#
#   bash benchmarks/gpu_record.sh
# OUT must be set: the GPU host's runner sets it to the folder whose contents come back, and a
# record written anywhere else stays on the host, so the script refuses to start without it.
# Knobs: WORK (a fresh mktemp -d folder per call), PYTHON (python3), BUDGET_S (total seconds, 440;
# with SMALL=1 four times the given one, default 1000: a CPU smoke run holds no lease, and on 2
# busy cores the GPU's budgets cut parts off),
# TIMED_S (seconds kept for phase 3, 200), JAXCAP_GIT_COMMIT (the commit every record names;
# default git rev-parse HEAD where the tree has its .git), ONLY (comma-separated part names: only
# those), NO_REFS=1 (no PyTorch references), SMALL=1 (tiny CPU smoke run).
set -u
if [[ -z "${OUT:-}" ]]; then
  echo "gpu_record.sh: OUT is not set; set it to the folder whose contents come back from the GPU host" >&2
  exit 2
fi
# the parts' records and logs, the compilation cache, traces, wheels: a folder of this call's own,
# so that no earlier call's records or cache entries are packed or loaded as this call's
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/jaxcap_gpu_work.XXXXXX")}
if [[ -z "${JAXCAP_GIT_COMMIT:-}" && -e .git ]]; then
  JAXCAP_GIT_COMMIT=$(git rev-parse HEAD 2>/dev/null) || JAXCAP_GIT_COMMIT=""
fi
export JAXCAP_GIT_COMMIT=${JAXCAP_GIT_COMMIT:-}  # benchmarks/run.py's environment() records it
echo "work folder $WORK; commit ${JAXCAP_GIT_COMMIT:-unknown}"
PY=${PYTHON:-python3}
if [[ "${SMALL:-0}" == 1 ]]; then
  # a 2-core CPU compiles even the tiny rows slower than the GPU host's 16 cores: a documented
  # call's budgets, run as a smoke test, get 4 times as long (the default 250 s becomes 1000 s)
  BUDGET_S=$(( ${BUDGET_S:-250} * 4 )); TIMED_S=$(( ${TIMED_S:-200} * 4 ))
else
  BUDGET_S=${BUDGET_S:-440}; TIMED_S=${TIMED_S:-200}
fi
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
  PI=40; PSHAPE=(--set dim=16,num_heads=2,ff_dim=32,num_layers=1,num_dec_layers=1 --batches 2)
  PXB=2,4; PXSHAPE=(--fields '{"image_size":32,"patch":8,"dim":32,"depth":1,"num_heads":2,"mlp_dim":64}'
                    --size 32 --set dim=16,num_heads=2,ff_dim=32,num_layers=1,num_dec_layers=1 --vocab 50); PXS=2
  DETB=1,2; DETSHAPE=(--small --windows 1 --steps 1)
  CLIPSHAPE=(--clip tiny --train_images 8 --set dim=16,num_heads=2,ff_dim=32,num_layers=1,num_dec_layers=1)
else
  SHAPE=(); B50=50; B100=100; BIG=200,800; DEV=cuda; REFS=()
  PI=600; PSHAPE=()
  PXB=32,128; PXSHAPE=(); PXS=20  # ViT-B/16 at 224 px + the paper-sized Transformer (issue 58)
  DETB=1,8; DETSHAPE=()             # the VG detector, 480 x 640 photos (600 x 800 canvases)
  CLIPSHAPE=(--clip vit_b32 --train_images 100 --set dim=512,num_layers=6,num_dec_layers=6,num_heads=8,ff_dim=2048)
fi
# grain and ml_collections for the input pipeline's part, carried as wheels (.whl) to a bare image
if [[ -d .whl ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $WORK/site .whl/*.whl \
    || echo "wheels not installed: the input-pipeline part will fail"
fi
RUN=("$PY" benchmarks/run.py "${SHAPE[@]}")

# 1. PyTorch references (strict fp32, TF32, bf16 autocast training; fp32 beam-3 decoding: d14's
#    ratio needs the reference's beam search measured in the same call)
if [[ -f .anchors/bench_pytorch_refs.py && -z "${NO_REFS:-}" ]]; then
  deadline 120 env OUT=$WORK/rec "$PY" .anchors/bench_pytorch_refs.py --models transformer,aoa \
    --modes fp32,tf32,bf16 --decode_modes fp32 --skip_decode TransformerModel:greedy,AoAModel:greedy \
    --device $DEV "${REFS[@]}"
  [[ -f $WORK/rec/results.json ]] && mv $WORK/rec/results.json $WORK/rec/pytorch_refs.json
fi

# The timed rows, most important first: "name|run.py arguments" (their order, not their names,
# says which go first). Only what decides the targets: the Transformer's training step plain and
# with the switches prepared on CPU (docs/PERFORMANCE.md "Switches prepared on CPU"), in float32
# and bfloat16 at 50 images and bfloat16 at 200 / 800 (profiled: the MFU target's batch), the
# SCST step with its parts, AoANet's training step, train.py's loop, the from-pixels memory, the
# region detector and the CLIP-S reward's SCST step; then one switch at a time.
# Earlier parts (t1-t18, every model's rows) are in git history and in benchmarks/results/.
SW="--dropout_bits 8 --set vocab_pad_multiple=128"           # the switches that also run in float32
SWB="--dropout_bits 8 --set vocab_pad_multiple=128,attention_impl=cudnn"   # and bfloat16's cuDNN
PARTS=(
  "d1|--models transformer --what train --dtype float32,bfloat16 --batch $B50"
  "d2|--models transformer --what train --dtype float32 --batch $B50 $SW"
  "d3|--models transformer --what train --dtype bfloat16 --batch $B50,$BIG $SWB --profile $WORK/prof"
  "d4|--models transformer --what scst,scst_split --dtype float32 --reward device --fused_decode off,on --batch $B50"
  "d5|--models aoanet --what train --dtype float32 --batch $B50"
  "d14|--models transformer,aoanet --what beam --dtype float32 --eval_batch $B100 --beam 3"
  "d6|@pipeline --images $PI --batch $B50 --batches 20 --threads 2 --workers 0 --loop_steps 60 --log_every 10 --loop_workers -1"
  # From pixels: images per second and memory per device at two batch sizes, remat off / on, in
  # bfloat16; both rules (on one GPU FSDP places everything on the one device: the same program)
  "d11|@sharded --batch $PXB --rules replicated,fsdp --remat 0,1 --dtype bfloat16 --steps $PXS"
  # The region detector (issue 71): photos per second, device program and end to end
  "d12|@detector --batch $DETB --dtype float32,bfloat16 ${DETSHAPE[*]}"
  # SCST with the CLIP-S reward against CIDEr-D at the paper-sized Transformer (issue 68)
  "d13|@clipreward --batch $B50 --steps 5 ${CLIPSHAPE[*]}"
  "d7|--models transformer --what train --dtype bfloat16 --batch $BIG"
  "d8|--models transformer --what train --dtype bfloat16 --batch $B50 --set attention_impl=cudnn"
  "d9|--models transformer --what train --dtype bfloat16 --batch $B50 --dropout_bits 8"
  "d10|--models transformer --what train --dtype bfloat16 --batch $B50 --set vocab_pad_multiple=128"
)
# cmd_of ARGS: the command of a part's arguments ("@pipeline ..." is benchmarks/input_pipeline.py)
cmd_of() {
  case $1 in
    @pipeline*) echo "env PYTHONPATH=$WORK/site $PY benchmarks/input_pipeline.py ${PSHAPE[*]} ${1#@pipeline }" ;;
    @sharded*) echo "env PYTHONPATH=$WORK/site $PY benchmarks/sharded_memory.py ${PXSHAPE[*]} ${1#@sharded }" ;;
    @detector*) echo "$PY benchmarks/detector.py ${1#@detector }" ;;
    @clipreward*) echo "env PYTHONPATH=$WORK/site $PY benchmarks/clip_reward_step.py ${1#@clipreward }" ;;
    *) echo "${RUN[*]} $1" ;;
  esac
}
# the arguments that make a part's run a compile-only one (argparse keeps an option's last value)
# (the loop keeps its step count: its learning-rate schedule is part of the compiled step)
quick_of() {
  case $1 in
    @pipeline*) echo "--batches 2 --threads 0" ;;
    @sharded*) echo "--steps 0" ;;  # compiles every program (their memory), runs none
    @detector*) echo "--windows 1 --steps 1" ;;
    @clipreward*) echo "--steps 1" ;;
    *) echo "--steps 1 --windows 1 --warmup 0" ;;
  esac
}
# Precompile groups, one process each, all at once (a paper-sized compile takes 10-130 s),
# items "part[:model]".
PRECOMPILE=("d1" "d2" "d3" "d4" "d5" "d6" "d7" "d8" "d9" "d10" "d11" "d12" "d13" "d14")
# ONLY=d7,d8 keeps those parts (a later call for the rows an earlier one did not reach)
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
echo "${#PRECOMPILE[@]}" > "$WORK/rec/precompile_processes"  # report.py --collect: compile_s_cold's concurrency
echo "[precompile: ${#PRECOMPILE[@]} processes at once]"
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

#!/usr/bin/env bash
# largest_batch.sh CONFIG RECOMPUTE [BUILD]: the largest batch (a multiple of 16) that runs
# `swin_train configs/CONFIG.ini bench=1` in bf16 with train.recompute=RECOMPUTE on this GPU: the
# planned device memory of batches 32 and 64 extrapolated to 97% of the GPU's, then that batch
# run (16 fewer while it fails), and 16 more to show the edge. Prints what ran, GiB and img/s.
cfg=$1 rc=$2; B=${3:-build}/swin_train
run() {
  timeout 400 "$B" "configs/$cfg.ini" bench=1 device=cuda precision=bf16 train.batch_size="$1" \
    train.recompute="$rc" bench.warmup=1 bench.steps=2 >"/tmp/mem_$1.log" 2>&1
}
mem() { awk '/device memory/ {print $4}' /tmp/mem_$1.log; }
ips() { awk '/img\/s \(median/ {print $4}' /tmp/mem_$1.log; }
run 32; run 64
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
max=$(python3 -c "m1,m2=$(mem 32),$(mem 64); per=(m2-m1)/32; fixed=m1-32*per; print(int(((($total/1024.0)*0.97)-fixed)/per)//16*16)")
echo "$cfg recompute=$rc: batch 32 $(mem 32) GiB, batch 64 $(mem 64) GiB; extrapolated max $max"
for try in 1 2 3 4; do
  if run $max; then echo "$cfg recompute=$rc: batch $max runs: $(mem $max) GiB, $(ips $max) img/s"; break; fi
  echo "batch $max fails: $(grep -m1 -i error /tmp/mem_$max.log)"; max=$((max - 16))
done
n=$((max + 16)); if run $n; then echo "batch $n also runs ($(mem $n) GiB)"; else echo "batch $n fails: $(grep -m1 -i -E 'error|out of memory' /tmp/mem_$n.log | cut -c1-150)"; fi

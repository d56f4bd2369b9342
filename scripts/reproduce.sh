#!/usr/bin/env bash
# Every number and picture in README.md's Results: run on a quiet machine, one benchmark at a time.
# Writes results/*.json (raw data), *.txt (the printed tables) and *.png. About 15 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p results
r=results

ringsgd bench allreduce --workers 2,4 --sizes 4KiB..64MiB --factor 4 --iters 20 --json $r/allreduce.json | tee $r/allreduce.txt

ringsgd bench step --workers 2 --model lenet --dataset mnist --batch 32 --algo ring,ps,native --iters 20 \
    --json $r/step-lenet.json | tee $r/step.txt
ringsgd bench step --workers 2 --model resnet20 --dataset cifar10 --batch 16 --algo ring,native --iters 10 \
    --json $r/step-resnet20.json | tee -a $r/step.txt
# the same LeNet step with the timeline recording, to measure what recording costs
ringsgd bench step --workers 2 --model lenet --dataset mnist --batch 32 --algo ring --iters 20 \
    --timeline $r/step-timeline.json --json $r/step-lenet-traced.json | tee -a $r/step.txt

ringsgd bench scaling --dataset digits --workers 1,2,4 --algo ring,ps,native --epochs 10 \
    --json $r/scaling.json --plot $r/scaling.png | tee $r/scaling.txt
ringsgd bench scaling --dataset digits --workers 1,2,4 --algo ring --regime weak --no-overlap --epochs 10 \
    --json $r/scaling-no-overlap.json --plot $r/scaling-no-overlap.png | tee $r/scaling-no-overlap.txt
# a larger per-worker batch: less communication per sample
ringsgd bench scaling --dataset digits --workers 1,2 --algo ring,ps,native --regime weak --batch 128 --epochs 10 \
    --json $r/scaling-b128.json --plot $r/scaling-b128.png | tee $r/scaling-b128.txt

# cost model: validated on this machine (link fitted from the all-reduce run, compute profiled here)
ringsgd simulate --model lenet --batch 32 --profile measure --threads 1 --steps 20 --links $r/allreduce-n2.json,$r/allreduce-n4.json \
    --workers 1,2,4 --algo ring,ps --validate $r/scaling.json --json $r/simulate-validate.json | tee $r/simulate.txt
ringsgd simulate --model lenet --batch 32 --profile measure --threads 1 --steps 20 --links $r/allreduce-n2.json,$r/allreduce-n4.json \
    --workers 1,2,4 --algo ring --validate $r/scaling-no-overlap.json --overlap off \
    --json $r/simulate-validate-no-overlap.json | tee -a $r/simulate.txt
ringsgd simulate --model lenet --batch 128 --profile measure --threads 1 --steps 10 \
    --links $r/allreduce-n2.json --workers 1,2 --algo ring,ps --validate $r/scaling-b128.json \
    --json $r/simulate-validate-b128.json | tee -a $r/simulate.txt
# ... and extrapolated: the paper's nets on GPUs of its time (5 TFLOP/s peak at 30%), N = 1..1024
for m in lenet cifar10_quick; do
  ringsgd simulate --model $m --batch 64 --profile flops --gpu-tflops 5 --efficiency 0.3 --links all \
      --workers 1..1024 --algo ring,ps --json $r/simulate-$m.json --plot $r/simulate-$m.png | tee -a $r/simulate.txt
done
# cifar10_quick's 569 KiB of gradients fit one default bucket (nothing to overlap): split it in three
ringsgd simulate --model cifar10_quick --batch 64 --profile flops --gpu-tflops 5 --efficiency 0.3 --links pcie3 \
    --workers 1,2,4,8 --algo ring,ps --first-bucket-cap-mb 0.125 --bucket-cap-mb 0.25 \
    --json $r/simulate-cifar10_quick-small-buckets.json | tee -a $r/simulate.txt

# where the time goes: one digits run with overlap, one without
for mode in overlap no-overlap; do
  flag=$([ $mode = no-overlap ] && echo --no-overlap || true)
  ringsgd train --dataset digits --workers 2 --epochs 1 --max-steps 30 --no-progress $flag \
      --timeline $r/timeline-$mode.json --out runs/timeline-$mode
  ringsgd timeline summarize $r/timeline-$mode.json --png $r/timeline-$mode.png --json $r/timeline-$mode-summary.json \
      | tee $r/timeline-$mode.txt
done

#!/bin/sh
# bench/cpu_scaling.py on a many-core machine, sized for one short device run (root,
# writable cgroups, torch and Reamer's dependencies installed): five zoo models, threads and
# CFS quotas 1-16, one round of 3 s windows: 55 windows, an estimated 6 minutes (at most 6 s
# each, as here, plus each model's start). The raw output goes to $OUT (default: the current
# folder); commit it as docs/data/cpu_scaling_<machine>.json and cite it in docs/calibration.md.
set -eu
out="${OUT:-.}/cpu_scaling_many_core.json"
exec python3 bench/cpu_scaling.py --json "$out" --models resnet50 mobilenet_v2 densenet121 vit_b16 bert_base \
    --threads 1 2 4 8 12 16 --quotas 1 2 4 8 16 --rounds 1 --run-s 3

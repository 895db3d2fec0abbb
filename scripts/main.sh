#!/usr/bin/env bash
# The main job, from a fresh machine: install everything, then train the Fashion-MNIST example
# with 2 workers as a job on a local cluster (2 nodes x 2 slots), follow its log to the end, list
# the trained model among the job's output files and print the command that serves it. The job
# service's home is the CLI's own (RINGTRAIN_HOME, default ~/.ringtrain), so the commands this
# prints work in any new shell.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

ringtrain cluster show local >/dev/null 2>&1 || ringtrain cluster create local --nodes 2 --slots 2
job=$(ringtrain job submit examples/fashion_mnist_job.yaml --cluster local -o json \
      | python -c 'import json, sys; print(json.load(sys.stdin)["id"])')
echo "submitted job $job; following rank 0's log (the job keeps running if you press Ctrl-C)"
ringtrain job logs "$job" --follow
ringtrain job show "$job"
echo "output files of $job:"
ringtrain job files "$job" outputs/model
state=$(ringtrain job show "$job" -o json | python -c 'import json, sys; print(json.load(sys.stdin)["state"])')
[ "$state" = succeeded ]
echo "serve the trained model (model.pt + model.json) with either of:"
echo "  ringtrain serve $job --port 8080          # fetched through the job service"
echo "  ringtrain job deploy $job                 # a deployment of the service"


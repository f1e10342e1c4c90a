#!/bin/bash
# The CPU profiles behind BENCHMARKS.md's "Where the CPU goes": iop sim, an edge and
# a node per path (tunnel, normalized) and an edge serving the provider itself,
# as make bench-peers starts them, each workload of the peer table for 12 s with
# an 8-second CPU profile (and the allocations) of every iop process in its
# middle; each profile sorted into classes by profile-classes.py.
# Usage: test/peers/profile.sh [iop binary, default bin/iop] [output dir]
HERE=$(dirname "$(realpath "$0")")
B=$(realpath "${1:-bin/iop}")
D=$(realpath -m "${2:-$(mktemp -d)}"); mkdir -p "$D"; cd "$D"
$B sim --protocol openai --listen 127.0.0.1:19601 --model m --default-max-tokens 20 --log-level warn > sim.log 2>&1 &
$B sim --protocol ollama --listen 127.0.0.1:19602 --model o --default-max-tokens 20 --log-level warn > osim.log 2>&1 &
sleep 0.5
$B edge --listen 127.0.0.1:19611 --node-listen 127.0.0.1:19612 --database $D/t.db --log-level warn --pprof-listen 127.0.0.1:19613 > tedge.log 2>&1 &
printf 'node_id: t\nedge: 127.0.0.1:19612\nproviders:\n  - {id: sim, type: sim, protocol: openai, base_url: "http://127.0.0.1:19601/v1", models: [m], capacity: 256}\n' > tnode.yaml
$B node --config tnode.yaml --log-level warn --pprof-listen 127.0.0.1:19614 > tnode.log 2>&1 &
$B edge --listen 127.0.0.1:19621 --node-listen 127.0.0.1:19622 --database $D/n.db --log-level warn --pprof-listen 127.0.0.1:19623 > nedge.log 2>&1 &
printf 'node_id: n\nedge: 127.0.0.1:19622\nproviders:\n  - {id: sim, type: sim, protocol: ollama, base_url: "http://127.0.0.1:19602", models: [o], capacity: 256}\n' > nnode.yaml
$B node --config nnode.yaml --log-level warn --pprof-listen 127.0.0.1:19624 > nnode.log 2>&1 &
printf 'providers:\n  - {id: sim, type: sim, protocol: openai, base_url: "http://127.0.0.1:19601/v1", models: [m], capacity: 256}\n' > iedge.yaml
$B edge --config iedge.yaml --listen 127.0.0.1:19631 --node-listen 127.0.0.1:19632 --database $D/i.db --log-level warn --pprof-listen 127.0.0.1:19633 > iedge.log 2>&1 &
sleep 3
run() { # name url model pprof-ports... -- bench args
  name=$1 url=$2 model=$3; shift 3; ports=(); while [ "$1" != "--" ]; do ports+=($1); shift; done; shift
  $B bench -q "$@" -d 3s --model $model --url $url >/dev/null 2>&1
  $B bench -q "$@" -d 12s --model $model --url $url > $name.bench 2>&1 &
  bp=$!
  sleep 2
  pids=(); i=0; for p in "${ports[@]}"; do curl -s "http://127.0.0.1:$p/debug/pprof/allocs" > $name-$i.a0; curl -s "http://127.0.0.1:$p/debug/pprof/profile?seconds=8" > $name-$i.pprof & pids+=($!); i=$((i+1)); done
  wait "${pids[@]}"
  i=0; for p in "${ports[@]}"; do curl -s "http://127.0.0.1:$p/debug/pprof/allocs" > $name-$i.a1; i=$((i+1)); done
  wait $bp
}
for w in "c1:-c 1" "c32:-c 32" "stream8:-c 8 --stream" "kb100:-c 8 --prompt-chars 102400"; do
  wn=${w%%:*}; args=${w#*:}
  run tunnel-$wn http://127.0.0.1:19611 m 19613 19614 -- $args
  run normalized-$wn http://127.0.0.1:19621 o 19623 19624 -- $args
  run inprocess-$wn http://127.0.0.1:19631 m 19633 -- $args
done
pkill -f "127.0.0.1:196" ; sleep 1
for f in *.pprof; do echo "== $f $(grep -h '^requests' ${f%-*}.bench)"; python3 "$HERE/profile-classes.py" $B $f; done > classes.txt
for f in *.a1; do b=${f%.a1}; echo "== $b $(go tool pprof -sample_index=alloc_space -base $b.a0 -top $B $f 2>/dev/null | grep -m1 'Showing nodes')"; done > allocs.txt
echo "profiles, classes.txt and allocs.txt in $D"

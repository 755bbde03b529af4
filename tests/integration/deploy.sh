#!/usr/bin/env bash
# What can be checked of deploy/ without a container runtime or a cluster:
#  - the Dockerfiles: every COPY source exists, COPY --from names a stage, the final stage
#    runs as a non-root user, the default model path is where the model is copied, the CPU
#    build stage's files alone pass CMake's configure step, and the CPU image's Debian
#    packages exist in the package lists (when apt-cache has lists);
#  - the image's default command and the Deployment's arguments start a real server here
#    (paths mapped to the checkout) that answers /health and exports the HPA's metric;
#  - the systemd unit (and with the CUDA drop-in) passes `systemd-analyze verify`, and its
#    offline `systemd-analyze security` exposure is at most 2.0 (when systemd is installed);
#  - the Kubernetes manifests parse (python3-yaml) and, rendered by `kubectl kustomize` when
#    kubectl is installed, hold a Deployment with /health probes, a Service, a PodMonitor
#    and an HPA on the adapter's metric; the cuda overlay asks for nvidia.com/gpu.
# usage: tests/integration/deploy.sh PAGODA_BINARY (from the project root)
set -uo pipefail
cd "$(dirname "$0")/../.."
PAGODA=${1:?usage: deploy.sh PAGODA_BINARY}
PAGODA=$(cd "$(dirname "$PAGODA")" && pwd)/$(basename "$PAGODA")
fail=0
bad() { echo "deploy: FAIL: $*"; fail=1; }
ok() { echo "deploy: ok   $*"; }
skip() { echo "deploy: SKIP $*"; }
TMP=$(mktemp -d)
SRV=
cleanup() { [ -n "$SRV" ] && kill "$SRV" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

# ---- Dockerfiles ----
for df in deploy/Dockerfile deploy/Dockerfile.cuda; do
  [ -f "$df" ] || { bad "$df missing"; continue; }
  stages=$(grep -iE '^FROM ' "$df" | sed -nE 's/.* [Aa][Ss] ([A-Za-z0-9_-]+)$/\1/p')
  while read -r line; do
    set -- $line
    shift
    from=
    case "$1" in --from=*) from=${1#--from=}; shift ;; esac
    n=$#
    dest=${!n}
    srcs=("${@:1:$((n - 1))}")
    if [ -n "$from" ]; then
      grep -qx "$from" <<<"$stages" || bad "$df: COPY --from=$from names no stage"
    else
      for s in "${srcs[@]}"; do [ -e "$s" ] || bad "$df: COPY source $s does not exist"; done
      case " ${srcs[*]} " in *" models/demo "*) model_dest=$dest ;; esac
    fi
  done < <(grep -E '^COPY ' "$df")
  user=$(grep -E '^USER ' "$df" | tail -n 1 | awk '{print $2}')
  case "${user%%:*}" in "" | 0 | root) bad "$df: the final stage runs as root" ;; esac
  cmd=$(grep -E '^CMD ' "$df" | tail -n 1)
  grep -qF "\"${model_dest:-none}\"" <<<"$cmd" || bad "$df: CMD's model is not ${model_dest:-the copied model}"
  ok "$df: COPY sources, stages, user ${user}, default model ${model_dest:-?}"
done

# The build stage's files alone configure: COPY what it copies into an empty folder and
# run its cmake line's configure step (the image's build would stop there first).
ctx="$TMP/context"
mkdir -p "$ctx"
while read -r line; do
  set -- $line
  shift
  case "$1" in --from=*) continue ;; esac
  n=$#
  dest=${!n}
  for s in "${@:1:$((n - 1))}"; do cp -r "$s" "$ctx/${dest#./}"; done
done < <(sed -n '1,/^FROM debian:${DEBIAN}-slim$/p' deploy/Dockerfile | sed -n '/AS build/,$p' | grep -E '^COPY ')
if out=$(cmake -S "$ctx" -B "$ctx/build" -DCMAKE_BUILD_TYPE=Release -DPAGODA_CUDA=OFF 2>&1); then
  ok "deploy/Dockerfile: the build stage's files configure ($(ls "$ctx" | tr '\n' ' '))"
else
  bad "deploy/Dockerfile: cmake configure of the build stage's files: $(grep -A4 "CMake Error" <<<"$out" | head -n 20)"
fi

if command -v apt-cache >/dev/null && [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -i packages)" ]; then
  pkgs=$(sed -n '/apt-get install/,/rm -rf/p' deploy/Dockerfile | tr ' \\' '\n\n' |
    grep -E '^[a-z0-9][a-z0-9.+-]+$' | grep -vE '^(apt-get|install|rm|update|qq|y|useradd)$' | sort -u)
  # one apt-cache call (each takes seconds): the names it has a candidate version for
  have=$(apt-cache policy $pkgs 2>/dev/null | awk '/^[^ ]/ { p = $1; sub(":$", "", p) }
    /Candidate:/ && $2 != "(none)" { print p }')
  missing=""
  for p in $pkgs; do grep -qx "$p" <<<"$have" || missing="$missing $p"; done
  [ -z "$missing" ] && ok "deploy/Dockerfile: $(wc -w <<<"$pkgs") Debian packages exist" ||
    bad "deploy/Dockerfile: packages not in the package lists:$missing"
else
  skip "Debian package names (no apt-cache or no package lists)"
fi

# ---- the default command and the Deployment's arguments start a server ----
# run_args NAME ARGS...: runs pagoda with ARGS, the image's paths mapped to this checkout,
# the port replaced by a free one, the host by loopback; checks /health and /metrics.
run_args() {
  local name=$1
  shift
  local a=() prev= y log="$TMP/server.log" failed=$fail
  fail=0
  # the events port: a free-looking one instead of 5557
  local kvp=$((20000 + RANDOM % 20000))
  for x in "$@"; do
    case "$prev" in
    --port) y=0 ;;
    --host) y=127.0.0.1 ;;
    --model) y=${x/\/usr\/share\/pagoda\/models/$PWD/models} ;;
    --kv-events-config) y=${x/tcp:\/\/\*:5557/tcp://*:$kvp} ;;
    *) y=$x ;;
    esac
    a+=("$y")
    prev=$x
  done
  "$PAGODA" "${a[@]}" 2>"$log" &
  SRV=$!
  local port=
  for _ in $(seq 100); do
    port=$(sed -nE 's/.*listening on http:\/\/[^:]+:([0-9]+).*/\1/p' "$log" | head -n 1)
    [ -n "$port" ] && break
    kill -0 "$SRV" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then
    bad "$name: the server did not start: $(cat "$log")"
    SRV=
    fail=$((1 | failed))
    return
  fi
  local code=
  for _ in $(seq 100); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
    [ "$code" = 200 ] && break
    sleep 0.1
  done
  [ "$code" = 200 ] || bad "$name: /health answered $code"
  curl -s "http://127.0.0.1:$port/metrics" >"$TMP/metrics"
  grep -q '^vllm:num_requests_waiting{' "$TMP/metrics" ||
    bad "$name: /metrics has no vllm:num_requests_waiting"
  kill -TERM "$SRV"
  wait "$SRV" || bad "$name: exit status $? after SIGTERM"
  SRV=
  [ $fail -eq 0 ] && ok "$name: ${a[*]}"
  fail=$((fail | failed))
}

cmd_json=$(grep -E '^CMD ' deploy/Dockerfile | tail -n 1 | sed 's/^CMD //')
mapfile -t cmd_args < <(node -e 'for (const a of JSON.parse(process.argv[1])) console.log(a)' "$cmd_json")
run_args "deploy/Dockerfile CMD" "${cmd_args[@]}"

# ---- systemd ----
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$TMP/unit"
  sed "s|/usr/local/bin/pagoda|$PAGODA|" deploy/systemd/pagoda.service >"$TMP/unit/pagoda.service"
  if out=$(systemd-analyze verify "$TMP/unit/pagoda.service" 2>&1) && [ -z "$out" ]; then
    ok "systemd-analyze verify pagoda.service"
  else
    bad "systemd-analyze verify pagoda.service: $out"
  fi
  # the drop-in's settings after the unit's, as systemd merges them
  mkdir -p "$TMP/cuda"
  { cat "$TMP/unit/pagoda.service"; cat deploy/systemd/cuda.conf; } >"$TMP/cuda/pagoda.service"
  if out=$(systemd-analyze verify "$TMP/cuda/pagoda.service" 2>&1) && [ -z "$out" ]; then
    ok "systemd-analyze verify pagoda.service + cuda.conf"
  else
    bad "systemd-analyze verify pagoda.service + cuda.conf: $out"
  fi
  score=$(systemd-analyze security --offline=yes "$TMP/unit/pagoda.service" 2>/dev/null |
    sed -nE 's/.*exposure level for pagoda.service: ([0-9.]+).*/\1/p')
  if [ -z "$score" ]; then
    skip "systemd-analyze security --offline (not supported by this systemd)"
  elif awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }'; then
    ok "systemd-analyze security: exposure $score"
  else
    bad "systemd-analyze security: exposure $score > 2.0"
  fi
else
  skip "systemd unit (no systemd-analyze)"
fi

# ---- Kubernetes ----
if ! python3 -c 'import yaml' 2>/dev/null; then
  skip "Kubernetes manifests (no python3-yaml)"
else
  render() { # render DIR OUT: kubectl kustomize, or the base files as they are
    if command -v kubectl >/dev/null && kubectl kustomize "$1" >"$2" 2>"$TMP/kustomize.err"; then
      echo kustomize
    elif command -v kubectl >/dev/null; then
      bad "kubectl kustomize $1: $(cat "$TMP/kustomize.err")"
      echo failed
    else
      python3 - "$1" "$2" <<'PY'
import sys, yaml, os
d, out = sys.argv[1], sys.argv[2]
k = yaml.safe_load(open(os.path.join(d, 'kustomization.yaml')))
docs = []
for r in k.get('resources', []):
    p = os.path.join(d, r)
    if os.path.isdir(p):
        sub = yaml.safe_load(open(os.path.join(p, 'kustomization.yaml')))
        docs += [yaml.safe_load(open(os.path.join(p, f))) for f in sub['resources']]
    else:
        docs.append(yaml.safe_load(open(p)))
for pt in k.get('patches', []):  # a strategic merge of the first container, enough here
    patch = yaml.safe_load(open(os.path.join(d, pt['path'])))
    for doc in docs:
        if doc['kind'] == patch['kind'] and doc['metadata']['name'] == patch['metadata']['name']:
            ps, ds = patch['spec']['template']['spec'], doc['spec']['template']['spec']
            for key, v in ps.items():
                if key != 'containers': ds[key] = v
            for key, v in ps['containers'][0].items(): ds['containers'][0][key] = v
yaml.safe_dump_all(docs, open(out, 'w'))
PY
      echo "python3-yaml (no kubectl)"
    fi
  }
  for dir in deploy/kubernetes/base deploy/kubernetes/overlays/cuda; do
    how=$(render "$dir" "$TMP/rendered.yaml")
    [ "$how" = failed ] && continue
    if out=$(python3 - "$TMP/rendered.yaml" "$dir" deploy/kubernetes/prometheus-adapter-rules.yaml <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
gpu = sys.argv[2].endswith('cuda')
kinds = {d['kind']: d for d in docs}
for k in ('Deployment', 'Service', 'PodMonitor', 'HorizontalPodAutoscaler'):
    assert k in kinds, f'no {k}'
dep = kinds['Deployment']
pod = dep['spec']['template']
c = pod['spec']['containers'][0]
ports = {p['name']: p['containerPort'] for p in c['ports']}
for probe in ('readinessProbe', 'livenessProbe', 'startupProbe'):
    g = c[probe]['httpGet']
    assert g['path'] == '/health' and g['port'] in ports, f'{probe}: {g}'
sel = dep['spec']['selector']['matchLabels']
assert all(pod['metadata']['labels'].get(k) == v for k, v in sel.items()), 'selector'
svc = kinds['Service']
assert all(pod['metadata']['labels'].get(k) == v for k, v in svc['spec']['selector'].items())
assert all(p['targetPort'] in ports for p in svc['spec']['ports']), 'service port'
pm = kinds['PodMonitor']['spec']
assert all(pod['metadata']['labels'].get(k) == v for k, v in pm['selector']['matchLabels'].items())
assert pm['podMetricsEndpoints'][0]['path'] == '/metrics'
assert pm['podMetricsEndpoints'][0]['port'] in ports
hpa = kinds['HorizontalPodAutoscaler']['spec']
assert hpa['scaleTargetRef']['name'] == dep['metadata']['name']
name = hpa['metrics'][0]['pods']['metric']['name']
rules = yaml.safe_load(open(sys.argv[3]))['rules']['custom']
assert any(r['name']['as'] == name and 'vllm:num_requests_waiting' in r['seriesQuery']
           for r in rules), f'no adapter rule serves {name}'
sc = c['securityContext']
assert sc['allowPrivilegeEscalation'] is False and pod['spec']['securityContext']['runAsNonRoot']
lim = c['resources'].get('limits', {})
if gpu:
    assert lim.get('nvidia.com/gpu') == '1' and '--device' in c['args'], 'GPU request'
    assert c['args'][c['args'].index('--device') + 1] == 'cuda'
else:
    assert 'nvidia.com/gpu' not in lim
print('\n'.join(c['args']))
PY
    ); then
      ok "$dir ($how): Deployment, Service, PodMonitor, HPA"
      if [ "$dir" = deploy/kubernetes/base ]; then
        mapfile -t dep_args <<<"$out"
        run_args "$dir Deployment args" "${dep_args[@]}"
      fi
    else
      bad "$dir: $out"
    fi
  done
fi

[ $fail -eq 0 ] && echo "deploy: every check passed"
exit $fail

#!/usr/bin/env bash
# deploy/cluster.sh: N `tokenloop serve` replicas on loopback behind HAProxy
# (deploy/haproxy/haproxy.cfg, docs/SCALING.md).
#
#   deploy/cluster.sh up --replicas N --port P [-m FILE] [--dir DIR] [--haproxy-cfg FILE]
#                        [--ready-timeout S] [-- SERVE-FLAGS]
#       starts replica i on port P+i (agent-check on P+100+i), HAProxy on P;
#       returns once every replica's /ready answers and /ready answers through
#       the proxy. A replica that exits, or is not ready within S seconds
#       (default 300, for the whole start), fails `up` with its name and log,
#       and the cluster is taken down again. Installs HAProxy from the Debian
#       package if it is missing; from a fresh clone it also builds tokenloop
#       and fetches the default model (SmolLM2, as make models).
#       --haproxy-cfg: another template than deploy/haproxy/haproxy.cfg.
#   deploy/cluster.sh status [--dir DIR]   each replica's state (ready, loading,
#                                          draining, stopped) and load
#   deploy/cluster.sh restart I [--dir DIR] [--ready-timeout S]
#                                          starts replica I again if it is not running
#                                          (after a crash or a drain); HAProxy takes it back
#                                          once its /ready answers
#   deploy/cluster.sh down [--dir DIR]     drains the replicas (SIGTERM), stops HAProxy
#
# Logs, pid files and the generated haproxy.cfg live in DIR (default
# deploy/run/). SERVE-FLAGS are added to each replica's command line after
# `-t T`, T being this machine's cores divided among the replicas; a -t or
# --threads among them replaces that.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:-}
[ -n "$cmd" ] && shift
which_replica=""
if [ "$cmd" = restart ]; then which_replica=${1:-}; [ -n "$which_replica" ] && shift; fi
replicas=3 port=8080 model="" dir="$ROOT/deploy/run" cfg="$ROOT/deploy/haproxy/haproxy.cfg" ready_timeout=300
serve_flags=()
while [ $# -gt 0 ]; do
    case "$1" in
    --replicas) replicas=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -m | --model) model=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --haproxy-cfg) cfg=$2; shift 2 ;;
    --ready-timeout) ready_timeout=$2; shift 2 ;;
    --) shift; serve_flags=("$@"); break ;;
    -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

alive() { # pid -> 0 when the process runs (a zombie does not: nobody may reap a killed replica)
    kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}

code() { # url path -> the HTTP status (000: no answer)
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1$2" 2>/dev/null || true
}

ready() { # url -> 0 when /ready answers 200 (loaded, not draining)
    [ "$(code "$1" /ready)" = 200 ]
}

why_not_ready() { # url -> what /health says: the model still loads (503), draining (200), or nothing
    case "$(code "$1" /health)" in
    503) echo "still loading the model (/health 503)" ;;
    200) echo "alive but not ready (/ready $(code "$1" /ready))" ;;
    *) echo "not answering" ;;
    esac
}

# wait_replica I END -> 0 once replica I's /ready answers; 1 (message printed) when
# its process exits or SECONDS passes END
wait_replica() {
    local i=$1 end=$2 p _a pid
    read -r p _a <"$dir/replica$i.ports"
    pid=$(cat "$dir/replica$i.pid")
    until ready "http://127.0.0.1:$p"; do
        if ! alive "$pid"; then
            echo "cluster.sh: replica $i (port $p) exited before it was ready; its log, $dir/replica$i.log, ends:" >&2
            tail -n 5 "$dir/replica$i.log" | sed 's/^/    /' >&2
            return 1
        fi
        if [ "$SECONDS" -ge "$end" ]; then
            echo "cluster.sh: replica $i (port $p) not ready after ${ready_timeout} s: $(why_not_ready "http://127.0.0.1:$p");" \
                "its log: $dir/replica$i.log (--ready-timeout S waits longer)" >&2
            return 1
        fi
        sleep 0.2
    done
}

up() {
    [[ "$replicas" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: --replicas must be a positive number" >&2; exit 2; }
    [[ "$ready_timeout" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: --ready-timeout must be a positive number of seconds" >&2; exit 2; }
    command -v curl >/dev/null || { echo "cluster.sh: needs curl" >&2; exit 1; }
    if ! command -v haproxy >/dev/null; then
        echo "cluster.sh: installing haproxy (Debian package)" >&2
        SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq haproxy >/dev/null
    fi
    local bin="${TOKENLOOP_BIN:-$ROOT/tokenloop}" # the binary (TOKENLOOP_BIN: another build)
    # from a fresh clone, one command: build the binary and fetch the default model
    if [ ! -x "$bin" ] && [ -z "${TOKENLOOP_BIN:-}" ]; then
        echo "cluster.sh: building tokenloop (scripts/setup.sh, make)" >&2
        (cd "$ROOT" && scripts/setup.sh && make -j"$(nproc)" tokenloop >/dev/null) || { echo "cluster.sh: build failed" >&2; exit 1; }
    fi
    [ -x "$bin" ] || { echo "cluster.sh: $bin missing (run make)" >&2; exit 1; }
    if [ -z "$model" ] && [ -z "${TOKENLOOP_MODEL:-}" ]; then
        model="$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" # absolute: the replicas may start anywhere
        [ -f "$model" ] || "$ROOT/scripts/fetch-models.sh" || { echo "cluster.sh: no model (make models)" >&2; exit 1; }
    fi
    mkdir -p "$dir"
    if [ -f "$dir/haproxy.pid" ] && alive "$(cat "$dir/haproxy.pid")"; then
        echo "cluster.sh: a cluster already runs from $dir (cluster.sh down first)" >&2; exit 1
    fi
    local threads=$(( $(nproc) / replicas )); [ "$threads" -ge 1 ] || threads=1
    # the serve flags come after the computed -t, so they add to it; one of
    # their own -t/--threads replaces it instead of following it
    local flags=(-t "$threads") f
    for f in ${serve_flags[@]+"${serve_flags[@]}"}; do
        case "$f" in -t | --threads | --threads=*) flags=() ;; esac
    done
    flags+=(${serve_flags[@]+"${serve_flags[@]}"})
    local servers="" agents=""
    for i in $(seq 1 "$replicas"); do
        local p=$((port + i)) a=$((port + 100 + i))
        local line=("$bin" serve ${model:+-m "$model"} --port "$p" --agent-port "$a" "${flags[@]}")
        printf '%q ' "${line[@]}" >"$dir/replica$i.cmd"
        "${line[@]}" >"$dir/replica$i.log" 2>&1 &
        echo $! >"$dir/replica$i.pid"
        echo "$p $a" >"$dir/replica$i.ports"
        servers+="server r$i 127.0.0.1:$p\n    "
        agents+="server r$i 127.0.0.1:$p agent-port $a\n    "
    done
    sed -e "s/@PORT@/$port/" -e "s|# @SERVERS@|$servers|" -e "s|# @SERVERS_AGENT@|$agents|" \
        "$cfg" >"$dir/haproxy.cfg"
    haproxy -c -q -f "$dir/haproxy.cfg" || { echo "cluster.sh: bad haproxy.cfg ($dir)" >&2; down; exit 1; }
    # every replica, each until the deadline or its exit, so one that cannot
    # start fails `up` rather than hanging it
    local end=$((SECONDS + ready_timeout))
    for i in $(seq 1 "$replicas"); do
        wait_replica "$i" "$end" || { echo "cluster.sh: up failed; taking the cluster down" >&2; down >&2; exit 1; }
    done
    # HAProxy only now: started while the replicas loaded, its first checks
    # saw /ready 503 and marked them down, and the keyed backend then sent
    # every key to whichever replica came back first (rise 2: seconds later)
    haproxy -D -f "$dir/haproxy.cfg" -p "$dir/haproxy.pid" >"$dir/haproxy.log" 2>&1
    # through both backends: unkeyed, and keyed (the header picks it)
    until ready "http://127.0.0.1:$port" && [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
        -H 'X-Session-ID: cluster.sh' "http://127.0.0.1:$port/ready" 2>/dev/null)" = 200 ]; do
        if [ "$SECONDS" -ge "$end" ]; then
            echo "cluster.sh: the replicas are ready but HAProxy (port $port) is not after ${ready_timeout} s;" \
                "its log: $dir/haproxy.log; taking the cluster down" >&2
            down >&2; exit 1
        fi
        sleep 0.2
    done
    echo "cluster: $replicas replicas behind http://127.0.0.1:$port (logs in $dir)"
}

status() {
    [ -f "$dir/haproxy.pid" ] || { echo "cluster.sh: no cluster in $dir" >&2; exit 1; }
    local hp; hp=$(cat "$dir/haproxy.pid")
    echo "haproxy: pid $hp $(alive "$hp" && echo running || echo stopped)"
    for f in "$dir"/replica*.pid; do
        [ -f "$f" ] || continue
        local i=${f##*/replica}; i=${i%.pid}
        local pid; pid=$(cat "$f")
        read -r p a <"$dir/replica$i.ports"
        local state load=""
        if ! alive "$pid"; then state=stopped
        elif ready "http://127.0.0.1:$p"; then state=ready
        else case "$(code "http://127.0.0.1:$p" /health)" in
            503) state=loading ;; 200) state=draining ;; *) state="not answering" ;;
            esac
        fi
        [ "$state" = stopped ] || load=$( (exec 3<>"/dev/tcp/127.0.0.1/$a" && head -1 <&3) 2>/dev/null || true)
        local m; m=$({ curl -s --max-time 2 "http://127.0.0.1:$p/metrics" 2>/dev/null || true; } |
            awk '/^vllm:num_requests_running/{r=$NF} /^vllm:num_requests_waiting/{w=$NF} /^vllm:kv_cache_usage_perc/{k=$NF} END{if (r != "") printf "running %s, waiting %s, KV use %s", r, w, k}')
        echo "replica $i: port $p, pid $pid, $state${load:+, agent: $load}${m:+, $m}"
    done
}

restart() {
    local i=$which_replica
    [[ "$i" =~ ^[0-9]+$ ]] && [ -f "$dir/replica$i.cmd" ] || { echo "cluster.sh: no replica '$i' in $dir" >&2; exit 2; }
    if [ -f "$dir/replica$i.pid" ] && alive "$(cat "$dir/replica$i.pid")"; then
        echo "cluster.sh: replica $i is running" >&2; exit 1
    fi
    # exec: $! must be the replica itself, not a shell around it that `down` would stop alone
    eval "exec $(cat "$dir/replica$i.cmd")" >>"$dir/replica$i.log" 2>&1 &
    echo $! >"$dir/replica$i.pid"
    [[ "$ready_timeout" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: --ready-timeout must be a positive number of seconds" >&2; exit 2; }
    if ! wait_replica "$i" $((SECONDS + ready_timeout)); then
        kill -KILL "$(cat "$dir/replica$i.pid")" 2>/dev/null || true # not left half-started
        exit 1
    fi
    local p _a; read -r p _a <"$dir/replica$i.ports"
    echo "cluster: replica $i back on port $p"
}

down() {
    for f in "$dir"/replica*.pid; do
        [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
    done
    for f in "$dir"/replica*.pid; do
        [ -f "$f" ] || continue
        local pid; pid=$(cat "$f")
        for _ in $(seq 1 400); do alive "$pid" || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        rm -f "$f"
    done
    if [ -f "$dir/haproxy.pid" ]; then
        local hp; hp=$(cat "$dir/haproxy.pid")
        kill "$hp" 2>/dev/null || true
        # gone, and its port free, before `down` (or a failed `up`) returns
        for _ in $(seq 1 50); do alive "$hp" || break; sleep 0.1; done
        rm -f "$dir/haproxy.pid"
    fi
    echo "cluster: down"
}

case "$cmd" in
up) up ;;
status) status ;;
restart) restart ;;
down) down ;;
-h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//' ;;
*) echo "usage: deploy/cluster.sh up|status|restart I|down [options] (try --help)" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Installs what the build and the tests need and is missing: a C compiler,
# make, PCRE2, SIMDe, libmicrohttpd, jansson and nettle (Debian packages) and the Python
# packages the tests check against (gguf, numpy, jinja2) or drive the server with
# (openai, anthropic, ollama, prometheus-client, jsonschema; setuptools and wheel
# build the Python package), Chromium with selenium for the
# live page's test, HAProxy for the scale-out test and kubernetes-validate
# for deploy/k8s/. Idempotent and quiet when everything is there.
set -euo pipefail
need_pkgs=()
command -v cc >/dev/null 2>&1 || need_pkgs+=(gcc)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
command -v unzip >/dev/null 2>&1 || need_pkgs+=(unzip)
[ -f /usr/include/pcre2.h ] || need_pkgs+=(libpcre2-dev)
[ -f /usr/include/simde/x86/avx512.h ] || need_pkgs+=(libsimde-dev)
[ -f /usr/include/microhttpd.h ] || need_pkgs+=(libmicrohttpd-dev)
[ -f /usr/include/jansson.h ] || need_pkgs+=(libjansson-dev)
[ -f /usr/include/nettle/sha2.h ] || need_pkgs+=(nettle-dev)
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3 python3-pip)
# the live page's browser test (tests/py/test_page.py): Chromium and its driver
[ -x /usr/bin/chromium ] || need_pkgs+=(chromium)
[ -x /usr/bin/chromedriver ] || need_pkgs+=(chromium-driver)
# scale-out behind HAProxy (deploy/cluster.sh, tests/py/test_cluster.py)
command -v haproxy >/dev/null 2>&1 || need_pkgs+=(haproxy)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
# a clean exit of `tokenloop serve`: every thread joined, nothing lost (tests/py/test_server_exit.py)
command -v valgrind >/dev/null 2>&1 || need_pkgs+=(valgrind)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    echo "setup: installing ${need_pkgs[*]}" >&2
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >&2
fi
if ! python3 -c 'import gguf, numpy, jinja2' >/dev/null 2>&1; then
    echo "setup: installing Python packages gguf, numpy, jinja2" >&2
    python3 -m pip install -q gguf numpy jinja2 >&2 ||
        python3 -m pip install -q --break-system-packages gguf numpy jinja2 >&2
fi
if ! python3 -c 'import openai, anthropic, ollama, prometheus_client, jsonschema, selenium, setuptools, wheel' >/dev/null 2>&1; then
    echo "setup: installing Python packages openai, anthropic, ollama, prometheus-client, jsonschema, selenium, setuptools, wheel" >&2
    python3 -m pip install -q openai anthropic ollama prometheus-client jsonschema selenium setuptools wheel >&2 ||
        python3 -m pip install -q --break-system-packages openai anthropic ollama prometheus-client jsonschema selenium \
            setuptools wheel >&2
fi
if ! command -v kubernetes-validate >/dev/null 2>&1; then
    echo "setup: installing Python package kubernetes-validate (deploy/k8s/ checks)" >&2
    python3 -m pip install -q kubernetes-validate >&2 ||
        python3 -m pip install -q --break-system-packages kubernetes-validate >&2
fi

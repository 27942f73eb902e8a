# Sourced by bin/jobs, bin/websocket_server, bin/demo and bin/setup: the Python that runs livepush.
# The checkout's .venv when there is one; else the first python3 that is 3.11 or newer (Ubuntu
# 22.04's python3 is 3.10, and a python3.11 may be installed beside it), with the checkout on
# PYTHONPATH. With none, one line naming what to install and exit 2: run by an older Python,
# `-P` failed with "Unknown option: -P" and Python's usage, which says nothing of the cause.
# Sets PY; reads ROOT (the checkout) and the caller's name from $0.

# Whether the Python given (a command or a path) runs and is 3.11 or newer.
is_recent_python() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }

# The first python3 on the PATH that is 3.11 or newer, printed; none: return 1.
recent_python() {
    local candidate
    for candidate in python3 python3.14 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null && is_recent_python "$candidate"; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

livepush_python() {
    if [[ -x $ROOT/.venv/bin/python ]]; then
        PY=$ROOT/.venv/bin/python
        return
    fi
    local found
    if PY=$(recent_python); then
        export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
        return
    fi
    found=$(python3 -V 2>/dev/null) || found="not installed"
    echo "bin/$(basename "$0"): livepush needs Python 3.11 or newer, and python3 is $found: install one" \
        "(sudo apt-get install -y python3.11 python3.11-venv), or run bin/demo once to make the checkout's .venv" >&2
    exit 2
}

# Sourced by bin/demo and bin/setup (so bin/test too): a .venv copied or moved with its checkout
# (`cp -r`) names the folder it was made for, so its activate script, its commands' shebangs and
# its editable install of livepush would run that other checkout. Both make it again, alike.
# Reads ROOT (the checkout) and the caller's name from $0.

# The .venv this checkout's .venv was made as, printed, when that is another checkout's; nothing
# when it is this one's, or there is none. venv writes that folder last on the `command` line of
# pyvenv.cfg, unquoted: the line's end tells this checkout's, whatever spaces its path has; the
# folder named is a guess. A .venv that is a link to a venv elsewhere (one venv shared by several
# checkouts) was not copied, and is not this checkout's to make again: `venv --clear` through the
# link would empty the venv the other checkouts run.
venv_made_for() {
    local made_in
    [[ ! -L $ROOT/.venv ]] || return 0
    made_in=$(sed -n 's/^command = //p' "$ROOT/.venv/pyvenv.cfg" 2>/dev/null || true)
    if [[ -n $made_in && $made_in != *" $(cd "$ROOT" && pwd -P)/.venv" ]]; then
        sed -n 's/^.* -m venv \(.* \)\{0,1\}\(\/.*\)$/\2/p' <<<"$made_in"
    fi
}

# remake_copied_venv PYTHON MADE_FOR: says that .venv was made for MADE_FOR (venv_made_for's
# answer) and makes it again, empty, for this checkout with PYTHON.
remake_copied_venv() {
    echo "bin/$(basename "$0"): .venv was made for ${2%/.venv} (copied or moved from there with the checkout):" \
        "making it again for this one with $1" >&2
    "$1" -m venv --clear "$ROOT/.venv"
}

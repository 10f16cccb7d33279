#!/usr/bin/env bash
# Set up growlm in ./.venv: torch first, the build this machine can use (a bare `torch` requirement
# would pull whatever build the index serves), then exactly the committed lock (requirements-lock.txt:
# every other package, its version and its files' hashes, for every supported platform and Python), then
# the package itself with the test tools and the eval extra (lm-evaluation-harness for evaluate.tasks,
# tensorboard for train.log_to).
#   bash setup.sh --dry-run REPORT       what the lock installs here (pip's --dry-run --report), nothing
#                                        installed; also with --offline DIR
#   bash setup.sh --lock                 make the lock again after pyproject.toml changed (needs uv: UV=...)
#
# Which torch (say it without installing anything: `bash setup.sh --which-torch`):
#   - TORCH_INDEX set: torch from that wheel index, as given, e.g.
#       TORCH_INDEX=https://download.pytorch.org/whl/cu128 bash setup.sh
#   - an NVIDIA driver (`nvidia-smi` runs and reports "CUDA Version: X.Y"): the CUDA build of the
#     newest CUDA in TORCH_CUDA_BUILDS not above X.Y (a build for a newer CUDA than the driver's
#     would not run); a driver older than all of them gets the CPU build, and says so;
#   - no NVIDIA driver: the CPU build, torch==VERSION+cpu from pip's own configured index (or
#     find-links) where it offers it, else PyTorch's CPU index; if that is out of reach, torch from
#     pip's configured index as it comes.
#   A torch .venv already has is kept, except a build without CUDA (by what it reports, torch.version.cuda)
#   on a machine with an NVIDIA driver whose CUDA build is chosen above: that one is replaced (a .venv made
#   on a GPU-less login node, on a shared file system, used on a GPU node). --cpu-torch keeps it.
#
# For a machine without a network (docs/setup.md, "Without a network"):
#   bash setup.sh --download DIR [--python X.Y] [--platform TAG] [--extras test,eval] [--no-torch]
#       on a machine with one: every wheel of the lock (the pinned packages and all they need, the
#       extras, the build backend) for that Python and platform (default: this machine's) into DIR, and
#       torch, as above for this machine; --extras says which extras the offline install asks for;
#   bash setup.sh --offline DIR [--machine-torch]
#       on the machine without one: .venv from DIR alone (pip --no-index --find-links DIR), exactly the
#       lock, every file checked against its hashes; torch from
#       DIR when it is there, else the machine's own if it is the pinned version (--machine-torch: the
#       machine's own whatever its version). A CPU build of torch on a machine with an NVIDIA driver is
#       refused unless --cpu-torch says it is meant.
#   For another machine (--python or --platform) the torch build is named: TORCH_INDEX (a CUDA build),
#   --cpu-torch (the CPU build) or --no-torch; a platform of another architecture than this machine's is
#   refused (pip evaluates the markers for the machine that downloads).
set -euo pipefail
START=$PWD  # a folder given relative to where setup.sh was called from
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.13.0
# PyTorch's CUDA builds of TORCH_VERSION, newest first, as "CUDA version:index suffix" (see the
# install matrix on pytorch.org when TORCH_VERSION changes)
TORCH_CUDA_BUILDS="13.0:cu130 12.8:cu128 12.6:cu126"
WHEELS=https://download.pytorch.org/whl

# the CUDA version the NVIDIA driver supports ("12.8"), empty without nvidia-smi or a working driver
driver_cuda() {
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    { nvidia-smi 2>/dev/null || true; } | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | sed -n 1p
}

# is version $1 <= version $2 (major.minor)?
version_le() {
    local a_major=${1%%.*} a_minor=${1#*.} b_major=${2%%.*} b_minor=${2#*.}
    [ "$a_major" -lt "$b_major" ] || { [ "$a_major" -eq "$b_major" ] && [ "$a_minor" -le "$b_minor" ]; }
}

# growlm's requirements (pyproject.toml: the dependencies, the extras asked for, the build backend), one a
# line, torch left out (it is fetched or found on its own)
requirements() {
    "$PYTHON" - "$1" <<'PY'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
extras = [e for e in sys.argv[1].split(",") if e]
unknown = [e for e in extras if e not in project["project"]["optional-dependencies"]]
if unknown:
    sys.exit(f"setup.sh: no extra {', '.join(unknown)} in pyproject.toml")
reqs = project["project"]["dependencies"] + [r for e in extras for r in project["project"]["optional-dependencies"][e]]
reqs += project["build-system"]["requires"]
print("\n".join(r for r in reqs if re.split(r"[=<>!~\[; ]", r)[0].lower() != "torch"))
PY
}

# --platform TAG for pip: manylinux_2_N_ARCH and every older manylinux tag of that architecture (a
# machine with glibc 2.N runs them all; pip itself adds none of them to a tag it is given)
platform_args() {
    [ -n "$PLATFORM" ] || return 0
    case $PLATFORM in
        manylinux_2_*)
            local rest=${PLATFORM#manylinux_2_} minor arch
            minor=${rest%%_*} arch=${rest#*_}
            while [ "$minor" -ge 5 ]; do echo "--platform manylinux_2_${minor}_$arch"; minor=$((minor - 1)); done
            echo "--platform manylinux2014_$arch --platform manylinux2010_$arch --platform manylinux1_$arch" ;;
        *) echo "--platform $PLATFORM" ;;
    esac
}

# the machine architecture of a wheel platform tag (manylinux_2_28_x86_64 -> x86_64), empty if it names none
platform_arch() {
    case $1 in
        *x86_64) echo x86_64 ;;
        *aarch64) echo aarch64 ;;
        *ppc64le) echo ppc64le ;;
        *s390x) echo s390x ;;
        *arm64) echo arm64 ;;
        *) echo "" ;;
    esac
}

# The one lock, committed (LOCK): every package growlm installs but torch, at exact versions with the sha256
# of each release's files, for every platform and Python growlm supports (a universal resolution, Python 3.11
# and newer: markers say what a platform or a Python needs). torch is left out, with what only torch needs: its
# build (CPU or CUDA) is chosen where it is installed, from its own index with its own libraries. Both set-ups
# install exactly the lock (--no-deps: it is whole), online from the index, offline from the folder.
# `bash setup.sh --lock` makes it again after pyproject.toml changed (uv, in a venv of its own: pip install uv;
# UV=/path/to/uv): uv keeps the versions already in it where they still fit.
LOCK=requirements-lock.txt
make_lock() {
    local uv=${UV:-uv} tmp
    command -v "$uv" >/dev/null 2>&1 || { echo "setup.sh: --lock needs uv (pip install uv into a venv of its own, then UV=that-venv/bin/uv)" >&2; exit 1; }
    tmp=$(mktemp -d)
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    requirements test,eval > "$tmp/requirements.in"
    # torch "on no platform": resolved apart from everything that needs it, so its own dependencies stay out
    echo "torch==$TORCH_VERSION ; sys_platform == 'never'" > "$tmp/torch-apart.txt"
    "$uv" pip compile --quiet --universal --generate-hashes --python-version 3.11 --override "$tmp/torch-apart.txt" \
        --no-emit-package torch --custom-compile-command "bash setup.sh --lock" "$tmp/requirements.in" -o "$LOCK"
    # what only torch needs carries torch's marker: left out too
    "$PYTHON" - "$LOCK" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
entries = re.split(r"(?m)^(?=[A-Za-z0-9])", text)
kept = [e for e in entries if not re.match(r"[^\n]*; sys_platform == 'never'", e)]
open(sys.argv[1], "w").write("".join(kept))
PY
    echo "setup.sh: $LOCK: $(grep -c '^[A-Za-z0-9]' "$LOCK") packages, with their hashes"
}

# install_lock PYTHON LOCKFILE [pip options]: exactly the lock's versions, each file checked against its hashes;
# with --dry-run REPORT, pip's report of what it would install (--ignore-installed: all of it), nothing installed
install_lock() {
    local python=$1 lock=$2
    shift 2
    if [ -n "$DRY_RUN" ]; then
        "$python" -m pip install --quiet --dry-run --ignore-installed --report "$DRY_RUN" --no-deps --require-hashes "$@" -r "$lock"
        echo "setup.sh: what $lock installs: $DRY_RUN (pip's --dry-run --report; nothing installed)"
        exit 0
    fi
    "$python" -m pip install --quiet --no-deps --require-hashes "$@" -r "$lock"
}

# add_hash LOCKFILE NAME WHEEL: the sha256 of a wheel built here from the release's source archive, beside the
# archive's own (which pip checked before building), so that the folder's lock accepts it
add_hash() {
    "$PYTHON" - "$@" <<'PY'
import hashlib, re, sys
lock, name, wheel = sys.argv[1:]
digest = hashlib.sha256(open(wheel, "rb").read()).hexdigest()
canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
lines = open(lock).read().split("\n")
for i, line in enumerate(lines):
    m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", line)
    if m and canon(m.group(1)) == canon(name):
        lines.insert(i + 1, f"    --hash=sha256:{digest} \\")
        if not line.rstrip().endswith("\\"):
            lines[i] = line.rstrip() + " \\"
            lines[i + 1] = lines[i + 1].rstrip(" \\")
        break
else:
    sys.exit(f"setup.sh: {name} is not in {lock}")
open(lock, "w").write("\n".join(lines))
PY
}

download_wheels() {
    local host target pip tmp log missing built tries=0 torch_says
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    host=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    target=${TARGET_PYTHON:-$host}
    pip=("$PYTHON" -m pip)
    tmp=$(mktemp -d)
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    # shellcheck disable=SC2207
    local opts=(--only-binary=:all: --python-version "$target" $(platform_args) -d "$DIR" --find-links "$DIR")
    [ "$target" = "$host" ] || echo "setup.sh: pip evaluates the packages' markers for this Python ($host), not $target: a dependency needed only on $target would be missing (PYTHON=python$target bash setup.sh ... fetches the exact set)"
    requirements "$EXTRAS" > "$DIR/growlm-requirements.txt"
    if [ -n "$NO_TORCH" ]; then
        torch_says="none (--no-torch: the machine it is for has its own)"
    else
        echo "setup.sh: $TORCH_SAYS: $TORCH_WHY"
        if [ "$TORCH_FROM" != cpu ]; then
            "${pip[@]}" download --quiet "${opts[@]}" "torch==$TORCH_VERSION" --index-url "$TORCH_FROM"
        elif ! "${pip[@]}" download --quiet "${opts[@]}" "torch==$TORCH_VERSION+cpu" 2>/dev/null; then
            "${pip[@]}" download --quiet "${opts[@]}" "torch==$TORCH_VERSION" --index-url "$WHEELS/cpu"
        fi
        torch_says=$(cd "$DIR" && ls torch-"$TORCH_VERSION"*.whl | head -n 1)
    fi
    # exactly the lock's versions: a wheel for the target where the index has one, else built here from the
    # release's source archive (its hash checked first), which must then be pure Python to serve the other
    # machine; the folder's copy of the lock takes the built wheel's hash beside the archive's
    cp "$LOCK" "$DIR/growlm-lock.txt"
    log=$tmp/pip.log
    until "${pip[@]}" download --quiet --no-deps --require-hashes "${opts[@]}" -r "$DIR/growlm-lock.txt" 2> "$log"; do
        missing=$(sed -n 's/.*No matching distribution found for \([^ ]*\).*/\1/p' "$log" | head -n 1)
        tries=$((tries + 1))
        if [ -z "$missing" ] || [ "$tries" -gt 20 ]; then
            cat "$log" >&2
            echo "setup.sh: the wheels for Python $target${PLATFORM:+ on $PLATFORM} could not all be fetched (above)" >&2
            exit 1
        fi
        rm -rf "$tmp/built"
        "$PYTHON" - "$LOCK" "${missing%%==*}" > "$tmp/one.txt" <<'PY'
import re, sys
canon = lambda n: re.sub(r"[-_.]+", "-", n).lower()
for entry in re.split(r"(?m)^(?=[A-Za-z0-9])", open(sys.argv[1]).read()):
    m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", entry)
    if m and canon(m.group(1)) == canon(sys.argv[2]):
        print(entry)
PY
        "${pip[@]}" wheel -qq --no-deps --require-hashes -w "$tmp/built" -r "$tmp/one.txt"
        built=$(ls "$tmp/built")
        case $built in
            *-none-any.whl) mv "$tmp/built/$built" "$DIR/"; add_hash "$DIR/growlm-lock.txt" "${missing%%==*}" "$DIR/$built"
                            echo "setup.sh: $missing has no wheel on the index (the release is a source archive); built $built from its source (pure Python)" ;;
            *) echo "setup.sh: $missing has no wheel for Python $target${PLATFORM:+ on $PLATFORM}, and builds only a platform wheel ($built): build it on such a machine (pip wheel $missing) into $DIR" >&2; exit 1 ;;
        esac
    done
    printf 'python %s\nplatform %s\ntorch %s\nextras %s\n' "$target" "${PLATFORM:-this machine}" "$torch_says" "$EXTRAS" \
        > "$DIR/growlm-wheels.txt"
    echo "setup.sh: $(ls "$DIR"/*.whl | wc -l) wheels ($(du -sh "$DIR" | cut -f1)) in $DIR for Python $target${PLATFORM:+ on $PLATFORM}, exactly the $(grep -c '^[A-Za-z0-9]' "$LOCK") versions of $LOCK; torch: $torch_says. On the machine without a network: bash setup.sh --offline $DIR"
}

# the version in the first line of $1's `NAME VALUE` manifest whose name is $2
manifest() { sed -n "s/^$2 //p" "$1/growlm-wheels.txt" | head -n 1; }

install_offline() {
    local want have machine machine_cuda extras venv_flags=() pip cpu_build= driver
    [ -f "$DIR/growlm-wheels.txt" ] || { echo "setup.sh: $DIR holds no wheels fetched by setup.sh --download (no growlm-wheels.txt)" >&2; exit 1; }
    [ -f "$DIR/growlm-lock.txt" ] || { echo "setup.sh: $DIR has no growlm-lock.txt (fetched by an older setup.sh): fetch it again with bash setup.sh --download" >&2; exit 1; }
    want=$(manifest "$DIR" python) have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$want" != "$have" ]; then
        echo "setup.sh: the wheels in $DIR are for Python $want and $PYTHON is Python $have: fetch them with --python $have, or run with PYTHON=python$want" >&2
        exit 1
    fi
    extras=$(manifest "$DIR" extras)
    machine=$("$PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
    machine_cuda=$("$PYTHON" -c 'import torch; print(torch.version.cuda or "")' 2>/dev/null || true)
    if [ -n "$MACHINE_TORCH" ] && [ -z "$machine" ]; then
        echo "setup.sh: --machine-torch, but $PYTHON has no torch" >&2
        exit 1
    fi
    if [ -z "$MACHINE_TORCH" ] && ls "$DIR"/torch-"$TORCH_VERSION"[-+]*.whl >/dev/null 2>&1; then
        TORCH_SAYS="torch $TORCH_VERSION from $DIR"
        cpu_build=$(cd "$DIR" && ls torch-"$TORCH_VERSION"[-+]*.whl | grep -E '(\+|%2B)cpu' | head -n 1 || true)
    elif [ -n "$MACHINE_TORCH" ] || [ "${machine%%+*}" = "$TORCH_VERSION" ]; then
        venv_flags=(--system-site-packages)  # the machine's torch, seen from the venv
        TORCH_SAYS="the machine's torch $machine"
        [ "${machine%%+*}" = "$TORCH_VERSION" ] || TORCH_SAYS="$TORCH_SAYS (--machine-torch; growlm pins $TORCH_VERSION and is tested with it)"
        [ -n "$machine_cuda" ] || cpu_build="$PYTHON's torch $machine"
    else
        echo "setup.sh: torch $TORCH_VERSION is neither in $DIR nor $PYTHON's own (${machine:-none}): fetch it into $DIR where there is a network (bash setup.sh --download $DIR ...), or use the machine's with --machine-torch" >&2
        exit 1
    fi
    driver=$(driver_cuda)
    if [ -n "$cpu_build" ] && [ -n "$driver" ] && [ -z "$CPU_TORCH" ]; then
        echo "setup.sh: this machine has an NVIDIA driver (CUDA $driver) and the torch to install is a CPU build ($cpu_build): its jobs would claim GPUs and train on the CPU. Fetch the CUDA build where there is a network (TORCH_INDEX=$WHEELS/cu130 bash setup.sh --download ...: the newest CUDA not above $driver), or pass --cpu-torch to install the CPU build on purpose" >&2
        exit 1
    fi
    echo "setup.sh: offline from $DIR (Python $want, extras '${extras}'), $TORCH_SAYS"
    [ -z "$DRY_RUN" ] || install_lock "$PYTHON" "$DIR/growlm-lock.txt" --no-index --find-links "$DIR"
    if [ ! -x .venv/bin/python ]; then
        "$PYTHON" -m venv ${venv_flags[@]+"${venv_flags[@]}"} .venv
    elif [ ${#venv_flags[@]} -gt 0 ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
        echo "setup.sh: .venv was made without the machine's packages, so it cannot see its torch: remove .venv and run this again" >&2
        exit 1
    fi
    pip=(.venv/bin/python -m pip install --quiet --no-index --find-links "$DIR")
    if [ -n "$MACHINE_TORCH" ]; then  # everything but torch from DIR, exactly the lock; growlm without its torch pin
        install_lock .venv/bin/python "$DIR/growlm-lock.txt" --no-index --find-links "$DIR"
        "${pip[@]}" --no-deps -e .
    else
        .venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==$TORCH_VERSION"
        install_lock .venv/bin/python "$DIR/growlm-lock.txt" --no-index --find-links "$DIR"  # the committed lock
        "${pip[@]}" -e ".${extras:+[$extras]}"
    fi
    .venv/bin/python -c "import growlm, torch, transformers, snakemake; print('growlm set up offline: torch', torch.__version__, '| CUDA', torch.version.cuda or 'none', '| transformers', transformers.__version__, '| snakemake', snakemake.__version__)"
}

# sets TORCH_FROM (an index URL, or "cpu") and TORCH_WHY
choose_torch() {
    if [ -n "${TORCH_INDEX:-}" ]; then
        TORCH_FROM=$TORCH_INDEX TORCH_WHY="TORCH_INDEX is set"
        return
    fi
    local cuda build
    cuda=$(driver_cuda)
    if [ -z "$cuda" ]; then
        TORCH_FROM=cpu
        if command -v nvidia-smi >/dev/null 2>&1; then
            TORCH_WHY="nvidia-smi reports no CUDA version (no working NVIDIA driver)"
        else
            TORCH_WHY="no NVIDIA driver (nvidia-smi not found)"
        fi
        return
    fi
    for build in $TORCH_CUDA_BUILDS; do
        if version_le "${build%%:*}" "$cuda"; then
            TORCH_FROM=$WHEELS/${build##*:}
            TORCH_WHY="the NVIDIA driver supports CUDA $cuda; ${build##*:} is the newest CUDA build of torch $TORCH_VERSION not above it"
            return
        fi
    done
    TORCH_FROM=cpu
    TORCH_WHY="the NVIDIA driver supports CUDA $cuda only, older than every CUDA build of torch $TORCH_VERSION ($TORCH_CUDA_BUILDS); update the driver for the GPU, or set TORCH_INDEX"
}

# What the online set-up does with the torch .venv already has, judged by what that torch reports
# (torch.version.cuda), not by its wheel's name: sets TORCH_ACTION (install, keep or replace) and TORCH_ACTION_WHY.
# A .venv made on a GPU-less login node (on a shared file system) has the CPU build; on a compute node with a
# driver its jobs would claim GPUs and train on the CPU, so there the CUDA build replaces it.
# what an installed torch reports as torch.__version__ and torch.version.cuda, read from its torch/version.py
# (run alone: importing torch takes seconds)
TORCH_REPORTS='
import importlib.util, os, runpy
spec = importlib.util.find_spec("torch")
v = runpy.run_path(os.path.join(os.path.dirname(spec.origin), "version.py"))
print(v["__version__"], v["cuda"] or "")'
venv_torch_plan() {
    local have version cuda driver
    if ! have=$(.venv/bin/python -c "$TORCH_REPORTS" 2>/dev/null); then
        TORCH_ACTION=install TORCH_ACTION_WHY=".venv has no torch"
        return
    fi
    read -r version cuda <<< "$have"
    driver=$(driver_cuda)
    TORCH_ACTION=keep
    if [ -n "$cuda" ]; then
        TORCH_ACTION_WHY=".venv's torch $version is a CUDA build (CUDA $cuda)"
    elif [ -z "$driver" ]; then
        TORCH_ACTION_WHY=".venv's torch $version has no CUDA, and this machine has no NVIDIA driver"
    elif [ "$TORCH_FROM" = cpu ]; then
        TORCH_ACTION_WHY=".venv's torch $version has no CUDA, and the CPU build is the one for this machine ($TORCH_WHY)"
    else
        TORCH_ACTION=replace
        TORCH_ACTION_WHY=".venv's torch $version has no CUDA (torch.version.cuda is None) and this machine has an NVIDIA driver (CUDA $driver): its jobs would claim GPUs and train on the CPU; torch $TORCH_VERSION from $TORCH_FROM replaces it"
    fi
}

MODE=online DIR= TARGET_PYTHON= PLATFORM= EXTRAS=test,eval NO_TORCH= MACHINE_TORCH= CPU_TORCH= DRY_RUN=
while [ $# -gt 0 ]; do
    case $1 in
        --which-torch) MODE=which ;;
        --lock) MODE=lock ;;
        --dry-run) DRY_RUN=${2:?"--dry-run needs a file for pip's report"}; shift
                   case $DRY_RUN in /*) ;; *) DRY_RUN=$START/$DRY_RUN ;; esac ;;
        --download|--offline) MODE=${1#--}; DIR=${2:?"$1 needs a folder"}; shift
                              case $DIR in /*) ;; *) DIR=$START/$DIR ;; esac ;;
        --python) TARGET_PYTHON=${2:?--python needs a version such as 3.12}; shift ;;
        --platform) PLATFORM=${2:?--platform needs a tag such as manylinux_2_28_x86_64}; shift ;;
        --extras) EXTRAS=${2?--extras needs a list (empty: none)}; shift ;;
        --no-torch) NO_TORCH=1 ;;
        --machine-torch) MACHINE_TORCH=1 ;;
        --cpu-torch) CPU_TORCH=1 ;;
        *) echo "setup.sh: unknown argument '$1' (see the head of setup.sh)" >&2; exit 2 ;;
    esac
    shift
done
if [ "$MODE" != download ] && { [ -n "$TARGET_PYTHON$PLATFORM$NO_TORCH" ] || [ "$EXTRAS" != test,eval ]; }; then
    echo "setup.sh: --python, --platform, --extras and --no-torch go with --download" >&2
    exit 2
fi
[ "$MODE" = offline ] || [ -z "$MACHINE_TORCH" ] || { echo "setup.sh: --machine-torch goes with --offline" >&2; exit 2; }
[ -z "$DRY_RUN" ] || [ "$MODE" = online ] || [ "$MODE" = offline ] || { echo "setup.sh: --dry-run goes with an install (online, or --offline)" >&2; exit 2; }
if [ "$MODE" = lock ]; then
    make_lock
    exit 0
fi

# pip evaluates the packages' markers (platform_machine) for the machine that downloads: a set for another
# architecture could miss what that one needs, so it is fetched there
if [ -n "$PLATFORM" ]; then
    TARGET_ARCH=$(platform_arch "$PLATFORM")
    if [ -n "$TARGET_ARCH" ] && [ "$TARGET_ARCH" != "$(uname -m)" ]; then
        echo "setup.sh: --platform $PLATFORM is for $TARGET_ARCH and this machine is $(uname -m): pip evaluates the packages' markers (platform_machine) for the machine that downloads, so the set could miss what $TARGET_ARCH needs; run --download on a $TARGET_ARCH machine" >&2
        exit 2
    fi
fi
if [ -n "$CPU_TORCH" ] && [ -z "${TORCH_INDEX:-}" ]; then
    TORCH_FROM=cpu TORCH_WHY="--cpu-torch: the CPU build, asked for"
elif [ "$MODE" = download ] && [ -n "$TARGET_PYTHON$PLATFORM" ] && [ -z "${TORCH_INDEX:-}" ] && [ -z "$NO_TORCH" ]; then
    # the other machine's driver is not visible from here: its build is named, never guessed (a CPU build
    # on a GPU node trains on the CPU without a word)
    echo "setup.sh: the wheels are for another machine, whose driver this one cannot see: name its torch build, TORCH_INDEX=$WHEELS/cu130 (cu128, cu126: the newest CUDA not above its driver's, nvidia-smi there) or --cpu-torch for the CPU build, or --no-torch where it has torch $TORCH_VERSION" >&2
    exit 2
else
    choose_torch
fi
if [ "$TORCH_FROM" = cpu ]; then
    TORCH_SAYS="torch $TORCH_VERSION, CPU build ($TORCH_VERSION+cpu from pip's configured index, else $WHEELS/cpu)"
else
    TORCH_SAYS="torch $TORCH_VERSION from $TORCH_FROM"
fi
if [ "$MODE" = which ]; then
    echo "$TORCH_SAYS: $TORCH_WHY"
    venv_torch_plan
    echo ".venv: $TORCH_ACTION torch: $TORCH_ACTION_WHY"
    exit 0
fi
if [ "$MODE" = download ]; then
    download_wheels
    exit 0
fi
if [ "$MODE" = offline ]; then
    install_offline
    exit 0
fi

if [ -n "$DRY_RUN" ]; then  # what the lock installs here, nothing installed
    install_lock "$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo "$PYTHON")" "$LOCK"
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
venv_torch_plan
if [ "$TORCH_ACTION" = replace ]; then
    echo "setup.sh: $TORCH_ACTION_WHY"
    .venv/bin/python -m pip uninstall --quiet --yes torch
fi
if [ "$TORCH_ACTION" != keep ]; then
    echo "setup.sh: $TORCH_SAYS: $TORCH_WHY"
    if [ "$TORCH_FROM" != cpu ]; then
        .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION" --index-url "$TORCH_FROM" || {
            echo "setup.sh: torch $TORCH_VERSION did not install from $TORCH_FROM; set TORCH_INDEX to a wheel index" \
                 "that has it (e.g. $WHEELS/cpu for the CPU build)" >&2
            exit 1
        }
    elif ! .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION+cpu" 2>/dev/null \
         && ! .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION" --index-url "$WHEELS/cpu"; then
        echo "setup.sh: no CPU build of torch $TORCH_VERSION within reach; torch $TORCH_VERSION from pip's configured index" >&2
        .venv/bin/python -m pip install --quiet "torch==$TORCH_VERSION"
    fi
fi
if [ "$TORCH_ACTION" = replace ] && [ -z "$(.venv/bin/python -c 'import torch; print(torch.version.cuda or "")')" ]; then
    echo "setup.sh: torch from $TORCH_FROM has no CUDA either: set TORCH_INDEX to the index of a CUDA build of torch $TORCH_VERSION, or pass --cpu-torch to keep the CPU build on purpose" >&2
    exit 1
fi
# exactly the committed lock, as the offline set-up installs it
install_lock .venv/bin/python "$LOCK"
.venv/bin/python -m pip install --quiet -e ".[test,eval]"
.venv/bin/python -c "import growlm, torch, transformers, snakemake; print('growlm set up: torch', torch.__version__, '| CUDA', torch.version.cuda or 'none', '| transformers', transformers.__version__, '| snakemake', snakemake.__version__)"

"""The Hugging Face Hub, asked once and never waited on: runs on machines without a network.

Compute nodes of shared clusters often have no network; their users fetch data on a login node and
run there from the Hub's local cache. huggingface_hub, datasets and transformers go offline only when
`HF_HUB_OFFLINE` is set; without it, on a machine that cannot reach the Hub, each file is asked for
again and again (five retries with back-off: half a minute per file) before the cache is used or
the call fails. growlm asks once, with a short time-out (`unreachable`):

* reachable: the Hub is used as usual;
* `HF_HUB_OFFLINE` set, or not reachable: every Hub file comes from the local cache
  (`hub_file`, `local_files_only`), the jobs inherit `HF_HUB_OFFLINE=1` and `HF_DATASETS_OFFLINE=1`
  (`go_offline`, which the Snakefile calls before any job starts), and what is not in the cache
  stops the run at once with one whole line naming it and the command that prepares it
  (`PREPARE`: the workflow's `prepare` target, run where there is a network, fetches every Hub
  dataset, Hub member and benchmark task's data; docs/gpu-and-clusters.md).

Torch-free: the Snakefile imports it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from huggingface_hub import constants, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError
from huggingface_hub.utils import get_session

from growlm.errors import GrowlmError

PROBE_TIMEOUT_S = 3.0  # one request to the Hub's endpoint, at most this long
PREPARE = "snakemake --cores all prepare"  # + the run's own --configfile/--config: fetches what needs the network
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def offline_set() -> bool:
    """HF_HUB_OFFLINE is set to a true value (as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


@functools.cache
def unreachable() -> str | None:
    """Why the Hub cannot be used now, or None: HF_HUB_OFFLINE is set, or one request to its endpoint
    failed within PROBE_TIMEOUT_S (the whole first line of the error). Asked once per process."""
    if offline_set() or constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)  # huggingface_hub's own client and proxies
        return None
    except Exception as err:  # noqa: BLE001 - no DNS, no route, a proxy, a time-out: all mean "cannot reach it"
        first = (str(err).strip().splitlines() or [""])[0]
        return f"the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached ({type(err).__name__}: {first})"


def go_offline() -> str | None:
    """When the Hub cannot be used (`unreachable`), set HF_HUB_OFFLINE and HF_DATASETS_OFFLINE for this
    process and the jobs it starts, so that no library waits on the network; returns the reason."""
    reason = unreachable()
    if reason:
        for name in OFFLINE_VARIABLES:
            os.environ[name] = "1"
    return reason


def cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def hub_file(repo: str, name: str, *, revision: str | None = None, what: str = "Hub model") -> Path | None:
    """A file of a Hub repository: downloaded (into the cache), or from the cache when the Hub cannot be
    used; None when the repository has no such file. GrowlmError, at once and whole, when it is neither
    reachable nor cached."""
    reason = unreachable()
    try:
        return Path(hf_hub_download(repo, name, revision=revision, local_files_only=reason is not None))
    except LocalEntryNotFoundError:  # (a subclass of EntryNotFoundError: first)
        if reason is None:
            raise GrowlmError(f"the {what} {repo!r} cannot be read: its {name} could not be downloaded") from None
        raise GrowlmError(f"the {what} {repo!r} cannot be read: {reason}, and its {name} is not in the local cache "
                          f"({cache_dir()}); fetch it where there is a network with `{PREPARE}` (and the same "
                          f"--configfile), then run here from the same cache (HF_HOME), or give a local folder "
                          f"instead of the id") from None
    except EntryNotFoundError:  # the repository has no such file
        return None
    except GrowlmError:
        raise
    except Exception as err:  # noqa: BLE001 - a wrong id, a private repository, a revision that is not there
        first = (str(err).strip().splitlines() or [""])[0]
        raise GrowlmError(f"the {what} {repo!r} cannot be read ({type(err).__name__}: {first})") from None

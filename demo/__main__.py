"""``python -m demo``: the end-to-end demo on the embedded defaults (see :mod:`demo`)."""

from __future__ import annotations

import os
import sys

# Prefect reads its settings when it is first imported: set the demo's defaults before that.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
if "-v" not in sys.argv[1:] and "--verbose" not in sys.argv[1:]:
    # run logs still reach the Prefect API (and UI); only the console is kept for the story
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the demo's model is a local folder: never ask the Hub
# the first run on a Prefect home builds the temporary server's database (half a minute of CPU, more
# on a loaded laptop): wait for it longer than a CLI lookup would
os.environ.setdefault("CONCORD_PREFECT_START_TIMEOUT", "300")

import argparse  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from demo._common import CLUSTERS, model_folder  # noqa: E402
from demo.audit import audit_story  # noqa: E402
from demo.federation import federation_folders, federation_story  # noqa: E402
from demo.lineage import lineage_folders, lineage_story  # noqa: E402
from demo.release import release_folders, release_story  # noqa: E402
from demo.snapshots import snapshots_folders, snapshots_story  # noqa: E402
from demo.story import Story  # noqa: E402
from demo.tiering import tiering_folders, tiering_story  # noqa: E402

#: the project's folder: its data/mlflow.db is the database `make serve` gives its worker
PROJECT_DIR = Path(__file__).resolve().parent.parent


def run(home: Path, story: Story) -> None:
    from concord.lineage.client import shown_uri

    base = model_folder()
    stores = {c: str(home / "stores" / c) for c in CLUSTERS}
    for path in (
        home / "stores", *snapshots_folders(home), *lineage_folders(home), *federation_folders(home), *tiering_folders(home),
        *release_folders(home),
    ):
        shutil.rmtree(path, ignore_errors=True)
    # what this home remembers of the ledgers in the stores just removed (a re-run starts them again
    # at round 1, which would otherwise read as a rollback)
    from concord.federation.seen import MEMORY_FILE

    for name in (MEMORY_FILE, MEMORY_FILE + ".lock"):
        (home / name).unlink(missing_ok=True)
    # MLflow's database is shared with `make serve` and kept: a re-run adds runs and versions to it
    home.mkdir(parents=True, exist_ok=True)
    print(f"Concord demo in {home}")
    print(f"checkpoint: all-MiniLM-L6-v2 from {base}")
    print("clusters:   " + ", ".join(f"{c} ({stores[c]})" for c in CLUSTERS))
    print(f"lineage:    MLflow at {shown_uri(os.environ['MLFLOW_TRACKING_URI'])}")

    start_prefect()
    base_root, tuned_root = snapshots_story(home, story, stores, base)
    lineage_story(home, story, stores, base_root, tuned_root)
    federation_story(home, story, stores, base)
    tiering_story(home, story, base)
    audit_story(home, story, stores, base)
    release_story(home, story, stores, base, snapshots_folders(home)[0])


def start_prefect() -> None:
    """The Prefect API the flows report to: the configured one, or Prefect's temporary server,
    started here deliberately (within CONCORD_PREFECT_START_TIMEOUT) rather than by the first flow."""
    from concord_pipelines.blocks.api import configured_api, ensure_api, start_timeout

    api = configured_api()
    if api:
        print(f"prefect:    {api}")
    else:
        print(f"prefect:    starting its temporary server (up to {start_timeout():g} s; the first run on a Prefect home "
              "builds its database) …", flush=True)
    t0 = time.monotonic()
    ensure_api("the demo")
    if not api:
        print(f"prefect:    temporary server up in {time.monotonic() - t0:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description="Concord's end-to-end demo on the embedded defaults.")
    parser.add_argument("-v", "--verbose", action="store_true", help="also show Prefect's run logs on the console")
    parser.parse_args(argv)
    home = Path(os.environ.get("CONCORD_HOME") or "data/demo").resolve()
    os.environ["CONCORD_HOME"] = str(home)
    # one MLflow database for the demo and the served flows: data/mlflow.db of the project, as
    # `make serve` gives its worker (unless MLFLOW_TRACKING_URI names another), so one `mlflow ui` shows both
    if not os.environ.get("MLFLOW_TRACKING_URI", "").strip():
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{PROJECT_DIR / 'data' / 'mlflow.db'}"
    story = Story()
    from concord.errors import PrefectUnavailableError

    try:
        run(home, story)
    except PrefectUnavailableError as exc:  # nothing ran: one line saying what to do, no traceback
        print(f"DEMO FAILED: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # a step that could not even run: report it as a failed check
        traceback.print_exc()
        story.check(False, f"the demo stopped: {type(exc).__name__}: {exc}")
    elapsed = time.monotonic() - story.t0
    print()
    if story.failed:
        print(f"DEMO FAILED: {len(story.failed)} of {story.passed + len(story.failed)} checks failed ({elapsed:.1f} s):")
        for claim in story.failed:
            print(f"  - {claim}")
        return 1
    print(f"Demo complete: all {story.passed} checks passed in {elapsed:.1f} s. Stores are in {home / 'stores'}, "
          f"the lineage graph in {home / 'lineage'}.")
    from concord.lineage.client import shown_uri

    uri = shown_uri(os.environ["MLFLOW_TRACKING_URI"])
    # the mlflow of this virtual environment, as the README writes it (.venv/bin/mlflow from the project)
    exe = Path(sys.executable).parent / "mlflow"
    shown = os.path.relpath(exe) if exe.is_relative_to(Path.cwd()) else str(exe)
    opens = f"{shown} ui --backend-store-uri {uri} --port 5000   # then open http://127.0.0.1:5000" if uri.startswith("sqlite:") else uri
    print(f"Lineage, drills and audits are in MLflow: {opens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

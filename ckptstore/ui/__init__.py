"""``ckptstore ui``: a server-rendered web view of the registry and storage (``pip install
ckptstore[ui]``).

Pages: experiments (config, a trials table sorted and filtered in SQL, searcher-metric and
hparam charts), trials (curves, hyperparameters, checkpoints with the rule that keeps each one,
logs, TensorBoard folder), checkpoints (metadata, manifest, verify, download as one archive,
register as a model version) and models (versions, aliases, labels, notes). Pages of running
trials refresh themselves. The only writes are ordinary registry calls behind a POST with a CSRF
token; ``read_only`` turns them off. Binding anywhere but loopback needs a token.

Example::

    from ckptstore.ui.settings import UiSettings
    from ckptstore.ui.server import serve

    serve(UiSettings(registry_url="sqlite:///reg.db", storage_url="/tmp/ckpts"), port=8765)
"""

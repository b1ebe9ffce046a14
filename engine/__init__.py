# Decide once per process whether the mypyc-compiled modules or their sources run (see
# engine/compiled.py): an edited source must never lose to a stale extension.
from engine.compiled import install_import_policy

install_import_policy()

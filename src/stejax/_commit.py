"""The commit this tree was exported from, written in by ``git archive`` (the file is ``export-subst``).

In a git checkout the value is the unsubstituted placeholder and the commit comes from git itself; in a tree
made with ``git archive`` it is the full commit id. :mod:`stejax.bench.results` reads it to name the commit of
a measurement taken on a machine without the repository.
"""

COMMIT = "$Format:%H$"

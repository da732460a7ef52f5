"""The library's doors: ``acer_sync.train`` and resuming (``runs``), a trained ``Policy``, the scripts'
command-line parsing, and what a run directory records about its run."""

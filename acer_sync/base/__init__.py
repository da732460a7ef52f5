"""The ground floor: settings (``Config``, config files), errors and exit codes, how a run ended
(``Outcome``), and phase timing. Every floor above may import it."""

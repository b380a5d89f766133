"""The ``fedsonmf`` command line: one module per command group (:mod:`.synthetic`,
:mod:`.cluster`, :mod:`.experiments`, :mod:`.flower`), assembled in :mod:`.app`."""

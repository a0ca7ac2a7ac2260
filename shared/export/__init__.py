"""The export's own vocabulary, apart from the infrastructure above it in ``shared/``: the export request
and its fingerprint, the file formats and their rendering, spreadsheet formulas, a message's shape, the
phases of an attempt and a schedule's cadence (docs/architecture.md: How it works, Layout).
"""

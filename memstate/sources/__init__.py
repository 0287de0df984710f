"""The released formats, read in one place: one module per format, each reading the maintainers' on-disk layout and
validating it (a bad record names its file, line or row, and field), for every stage alike — ``data_build`` builds
instances from what they read, ``memory`` ingests it, ``evaluate`` asks its questions.

- ``fever``: FEVER 1.0 claim files and the wiki-pages dump;
- ``scifact``: SciFact claim files and ``corpus.jsonl``;
- ``personamem``: PersonaMem questions CSVs and shared-contexts JSONL;
- ``locomo``: LoCoMo's ``locomo10.json``;
- ``memsyco``: MemSyco-Bench JSONL rows, validated against its ``schema.json``;
- ``skips``: the skipped-record log the readers share (strict, or ``--skip-invalid``: every skip listed);
- ``labels``: the claim sources' label spellings.
"""

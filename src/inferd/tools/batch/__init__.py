"""`inferd batch`: a model run over a whole dataset, SageMaker batch transform's way, resumable.

The job reads its input files (local or fsspec URLs), cuts each into records (`records`), packs
records into mini-batches (`run`), turns them into tensors and the answers into output records
(`convert`: SageMaker's filters and join), runs them on an engine (`engines`: in this process
through core's one entry point, or a server through inferd's client), and keeps its work in the
output location (`store`): each shard's part written whole, the manifest that names the job, the
`.out` files assembled in input order, the errors and the summary beside them.
"""

"""Batch jobs, from submission to `on_job_complete`: the job (`job.py`) and its submission
(`submission.py`), cutting its input into batches (`enqueue.py`, `inputs.py`, `publish.py`), a
batch's run on a node (`steps.py`, `predictors.py`, `time_limit.py`), its outputs (`outputs.py`),
the fan-in and completion (`completion.py`), the public status (`status.py`), and TaskAPI jobs
(`taskapi_jobs.py`: a job of one run)."""

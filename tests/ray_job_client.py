"""Ray's job SDK (JobSubmissionClient, from the `ray` package, unmodified)
against a raylet head's HTTP port: what tests/ray_job_api.rs runs.

    ray_job_client.py ADDRESS TOKEN WORKING_DIR BIG_DIR

Prints one line per check that held and exits 1 at the first that did not.
"""

import json
import sys
import time

import requests
from ray.exceptions import AuthenticationError
from ray.job_submission import JobStatus, JobSubmissionClient

address, token, working_dir, big_dir = sys.argv[1:5]
headers = {"Authorization": f"Bearer {token}"}
client = JobSubmissionClient(address, headers=headers)


def refused(call, says):
    """Runs `call`, which must fail with an error whose text has `says`."""
    try:
        call()
    except Exception as error:  # noqa: BLE001: any error class, its text checked
        assert says in str(error), f"expected {says!r} in: {error}"
        return str(error)
    raise AssertionError(f"expected a refusal saying {says!r}")


def wait_for(submission_id, statuses, seconds=60):
    deadline = time.time() + seconds
    while time.time() < deadline:
        status = client.get_job_status(submission_id)
        if status in statuses:
            return status
        time.sleep(0.2)
    raise AssertionError(f"{submission_id} is still {status}, not one of {statuses}")


job = client.submit_job(
    entrypoint="sh run.sh",
    submission_id="sdk-1",
    runtime_env={"working_dir": working_dir, "env_vars": {"MODE": "sdk"}},
    metadata={"owner": "sdk"},
)
assert job == "sdk-1", job
wait_for(job, {JobStatus.SUCCEEDED})
logs = client.get_job_logs(job)
assert "working dir has: hello from the working dir" in logs and "MODE is sdk" in logs, logs
info = client.get_job_info(job)
assert (info.type.value, info.entrypoint, info.metadata) == ("SUBMISSION", "sh run.sh", {"owner": "sdk"}), info
assert info.start_time <= info.end_time and info.driver_exit_code == 0, info
print(f"ok submit with a working_dir and env_vars, logs and info: {info.status.value} in {info.end_time - info.start_time} ms")

listed = {details.submission_id: details for details in client.list_jobs()}
assert "sdk-1" in listed and listed["sdk-1"].status == JobStatus.SUCCEEDED, listed
print(f"ok list_jobs: {len(listed)} jobs")

tail = []


async def follow(submission_id):
    async for lines in client.tail_job_logs(submission_id):
        tail.append(lines)


long_running = client.submit_job(entrypoint="echo started; sleep 300")
assert long_running.startswith("raysubmit_"), long_running
wait_for(long_running, {JobStatus.RUNNING})
refused(lambda: client.delete_job(long_running), "stop it first")
assert client.stop_job(long_running) is True
wait_for(long_running, {JobStatus.STOPPED})
assert client.stop_job(long_running) is False, "a stopped job is not stopped again"
import asyncio  # noqa: E402: only the tail needs it

asyncio.run(follow(long_running))
assert "".join(tail) == "started\n", tail
print("ok a running job is stopped, its tail ends, and it cannot be deleted while it runs")

assert client.delete_job(long_running) is True
refused(lambda: client.get_job_info(long_running), f"Job {long_running} does not exist")
print("ok a deleted job is gone")

refused(lambda: client.submit_job(entrypoint="true", submission_id="sdk-1"), "already exists")
refused(
    lambda: client.submit_job(entrypoint="true", runtime_env={"pip": ["requests"]}),
    "raylet cannot honour runtime_env.pip",
)
refused(
    lambda: client.submit_job(entrypoint="true", runtime_env={"image_uri": "repo/image:1"}),
    "raylet cannot honour runtime_env.image_uri",
)
unknown_field = requests.post(
    f"{address}/api/jobs/", json={"entrypoint": "true", "priority": 1}, headers=headers, timeout=30
)
assert unknown_field.status_code == 400 and "unknown field `priority`" in unknown_field.text, unknown_field.text
print("ok a reused id, pip, image_uri and an unknown field are refused, saying why")

too_big = refused(
    lambda: client.submit_job(entrypoint="true", runtime_env={"working_dir": big_dir}),
    "over this head's limit of 60 MiB",
)
print(f"ok a working_dir over the limit is refused: {too_big.splitlines()[-1][:160]}")

refused(lambda: JobSubmissionClient(address).list_jobs(), "Authentication required")
refused(
    lambda: JobSubmissionClient(address, headers={"Authorization": "Bearer " + "0" * 64}).list_jobs(),
    "Authentication required",
)
print("ok no token or a wrong one is refused")
print(json.dumps({"jobs": len(client.list_jobs())}))

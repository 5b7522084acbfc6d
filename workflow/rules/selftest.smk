# Stage 1b: before any teacher job, the runner against transformers' own forward on the run's model (a few
# short random sequences); a mismatch fails this job in one line and no teacher job starts. A model that cannot be
# compared here (larger than the job's memory, an FP8 release) is recorded as not run, and the teacher goes on.


rule selftest:
    input:
        config=local(CONFIG_FILE),
    output:
        "results/{run}/selftest.json",
    log:
        "logs/{run}/selftest.log",
    benchmark:
        "benchmarks/{run}/selftest.tsv"
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=0,
    params:
        device=device,
    shell:
        "fideval selftest --config {input.config:q} --device {params.device} --if-possible --out {output:q} > {log:q} 2>&1"

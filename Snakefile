# fideval: windows -> teacher logits -> candidate + score -> records -> report -> card.
# Run the embedded demo with `snakemake --cores all`; another evaluation with `--configfile configs/X.yaml`.
from snakemake.utils import min_version

min_version("8.20")


configfile: "configs/demo.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/windows.smk"
include: "workflow/rules/selftest.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/noise.smk"


rule all:
    default_target: True
    input:
        final_outputs(),

"""What the cluster's scheduler tells the launcher, and what the launcher tells it back.

Slurm (``srun`` with one task per node) and Kubernetes (Indexed Jobs, JobSets and
Kubeflow Trainer) each set environment variables that say which job this is, how many
nodes it has, which one hosts the rendezvous and what this node was granted. This
package reads them into the launcher's settings (explicit flags always win), reports
progress to the scheduler where it asks for it, and states which exit codes mean
"retry" and which mean "do not".

Decisions are plain functions of the environment; the few that must ask the
scheduler (``scontrol``) or post to it are async, bounded and never block the loop.
"""

__all__ = ()

"""The book's figures, one module per chapter in the book's order.

Each function draws one figure from plain results (measured numbers, estimates, schedules)
and returns its Axes or Figure: no global state, no timestamps, the same picture for the
same arguments, and no model logic (formulas live in `minipar.plan.formulas` and the cost model).
The notebooks import them all at once: `from minipar.teach import figures as viz`.
"""
from .cluster import plot_exposure, plot_trace_tracks, step_window
from .collectives import RING_FRACTION, RING_LABEL, plot_all_reduce_time, plot_ring_bytes
from .context_parallel import (plot_allgather_mask, plot_cp_bytes, plot_cp_layout,
                               plot_cp_memory, plot_cp_work)
from .data_parallel import (overlap_from_trace, overlap_rows, plot_comm_per_stage,
                            plot_loss_curves, plot_overlap_timeline, plot_zero_memory)
from .failures import plot_checkpoint_waste, plot_interruptions, plot_restart_curves
from .fourd import (describe_grid, plot_bubble_threshold, plot_cp_threshold, plot_dp_threshold,
                    plot_plan, plot_rank_grid, plot_tp_threshold)
from .memory import (plot_layer_breakdown, plot_measured_vs_predicted, plot_recompute_tradeoff,
                     plot_table4_budget)
from .mfu import (comm_volume_figure, measured_vs_predicted_figure, memory_figure,
                  network_figure, nic_sensitivity_figure, table4_figure)
from .pipeline_parallel import plot_bubble_vs_microbatches, plot_schedule, plot_trace
from .tensor_parallel import (plot_collective_matmul, plot_saved_activations, plot_tp_comm,
                              plot_tp_memory)


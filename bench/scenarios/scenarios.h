// The scenarios of sluice-bench (sluice_bench.cc): one file each in this folder, each entered
// through its main with the command line of the program it once was (sluice-bench-<program>).
#pragma once

int bench_accuracy_main(int argc, char** argv);
int bench_chaos_main(int argc, char** argv);
int bench_client_native_main(int argc, char** argv);
int bench_cluster_main(int argc, char** argv);
int bench_cluster_sim_main(int argc, char** argv);
int bench_crash_main(int argc, char** argv);
int bench_detect_main(int argc, char** argv);
int bench_edges_main(int argc, char** argv);
int bench_engine_main(int argc, char** argv);
int bench_gaps_main(int argc, char** argv);
int bench_keyspray_main(int argc, char** argv);
int bench_load_main(int argc, char** argv);
int bench_ring_main(int argc, char** argv);
int bench_rls_main(int argc, char** argv);
int bench_soak_main(int argc, char** argv);
int bench_store_main(int argc, char** argv);
int bench_sync_main(int argc, char** argv);

#pragma once

#include <map>
#include <string_view>
#include <utility>
#include <vector>

namespace torchloom::detail {

//! The value kinds of Triton's ModelConfig fields, as protobuf text format writes them.
enum class pb_kind { string, boolean, int32, int64, uint32, uint64, real, enumeration, message };

//! One field of a message in the schema: its name, kind, whether it repeats, the message or
//! enum it refers to (for message and enum kinds), and the oneof it belongs to (if any).
struct pb_field_schema {
  std::string_view name;
  pb_kind kind;
  bool repeated;
  std::string_view type;   //!< message or enum name
  std::string_view oneof;  //!< fields of one oneof exclude each other

  constexpr pb_field_schema(std::string_view n, pb_kind k, bool r = false,
                            std::string_view t = {}, std::string_view o = {})
      : name(n), kind(k), repeated(r), type(t), oneof(o) {}
};

//! Triton's ModelConfig message and everything it contains (model_config.proto of Triton's
//! `common` repository), as field names, kinds and enum values: what config.pbtxt is checked
//! against. A `map<K, V>` field is a repeated message of `key` and `value`, as text format
//! writes it.
struct model_config_schema {
  std::map<std::string_view, std::vector<pb_field_schema>> messages;
  std::map<std::string_view, std::vector<std::pair<std::string_view, int>>> enums;

  static const model_config_schema& get() {
    static const model_config_schema s = make();
    return s;
  }

 private:
  static model_config_schema make() {
    using k = pb_kind;
    constexpr bool rep = true;
    model_config_schema s;
    s.enums["DataType"] = {{"TYPE_INVALID", 0}, {"TYPE_BOOL", 1},   {"TYPE_UINT8", 2},
                           {"TYPE_UINT16", 3},  {"TYPE_UINT32", 4}, {"TYPE_UINT64", 5},
                           {"TYPE_INT8", 6},    {"TYPE_INT16", 7},  {"TYPE_INT32", 8},
                           {"TYPE_INT64", 9},   {"TYPE_FP16", 10},  {"TYPE_FP32", 11},
                           {"TYPE_FP64", 12},   {"TYPE_STRING", 13}, {"TYPE_BF16", 14}};
    s.enums["InstanceKind"] = {{"KIND_AUTO", 0}, {"KIND_GPU", 1}, {"KIND_CPU", 2},
                               {"KIND_MODEL", 3}};
    s.enums["SecondaryDeviceKind"] = {{"KIND_NVDLA", 0}};
    s.enums["Format"] = {{"FORMAT_NONE", 0}, {"FORMAT_NHWC", 1}, {"FORMAT_NCHW", 2}};
    s.enums["BatchInputKind"] = {{"BATCH_ELEMENT_COUNT", 0},
                                 {"BATCH_ACCUMULATED_ELEMENT_COUNT", 1},
                                 {"BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", 2},
                                 {"BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", 3},
                                 {"BATCH_ITEM_SHAPE", 4},
                                 {"BATCH_ITEM_SHAPE_FLATTEN", 5}};
    s.enums["BatchOutputKind"] = {{"BATCH_SCATTER_WITH_INPUT_SHAPE", 0}};
    s.enums["ModelPriority"] = {{"PRIORITY_DEFAULT", 0}, {"PRIORITY_MAX", 1},
                                {"PRIORITY_MIN", 2}};
    s.enums["TimeoutAction"] = {{"REJECT", 0}, {"DELAY", 1}};
    s.enums["ControlKind"] = {{"CONTROL_SEQUENCE_START", 0}, {"CONTROL_SEQUENCE_READY", 1},
                              {"CONTROL_SEQUENCE_END", 2}, {"CONTROL_SEQUENCE_CORRID", 3}};

    s.messages["ModelConfig"] = {
        {"name", k::string},
        {"platform", k::string},
        {"backend", k::string},
        {"runtime", k::string},
        {"version_policy", k::message, false, "ModelVersionPolicy"},
        {"max_batch_size", k::int32},
        {"input", k::message, rep, "ModelInput"},
        {"output", k::message, rep, "ModelOutput"},
        {"batch_input", k::message, rep, "BatchInput"},
        {"batch_output", k::message, rep, "BatchOutput"},
        {"optimization", k::message, false, "ModelOptimizationPolicy"},
        {"dynamic_batching", k::message, false, "ModelDynamicBatching", "scheduling_choice"},
        {"sequence_batching", k::message, false, "ModelSequenceBatching", "scheduling_choice"},
        {"ensemble_scheduling", k::message, false, "ModelEnsembling", "scheduling_choice"},
        {"instance_group", k::message, rep, "ModelInstanceGroup"},
        {"default_model_filename", k::string},
        {"cc_model_filenames", k::message, rep, "map<string,string>"},
        {"metric_tags", k::message, rep, "map<string,string>"},
        {"parameters", k::message, rep, "map<string,ModelParameter>"},
        {"model_warmup", k::message, rep, "ModelWarmup"},
        {"model_operations", k::message, false, "ModelOperations"},
        {"model_transaction_policy", k::message, false, "ModelTransactionPolicy"},
        {"model_repository_agents", k::message, false, "ModelRepositoryAgents"},
        {"response_cache", k::message, false, "ModelResponseCache"},
        {"model_metrics", k::message, false, "ModelMetrics"},
    };
    s.messages["map<string,string>"] = {{"key", k::string}, {"value", k::string}};
    s.messages["map<string,ModelParameter>"] = {{"key", k::string},
                                                {"value", k::message, false, "ModelParameter"}};
    s.messages["ModelParameter"] = {{"string_value", k::string}};
    s.messages["ModelRateLimiter"] = {{"resources", k::message, rep, "RateLimiterResource"},
                                      {"priority", k::uint32}};
    s.messages["RateLimiterResource"] = {
        {"name", k::string}, {"global", k::boolean}, {"count", k::uint32}};
    s.messages["ModelInstanceGroup"] = {
        {"name", k::string},
        {"kind", k::enumeration, false, "InstanceKind"},
        {"count", k::int32},
        {"rate_limiter", k::message, false, "ModelRateLimiter"},
        {"gpus", k::int32, rep},
        {"secondary_devices", k::message, rep, "SecondaryDevice"},
        {"profile", k::string, rep},
        {"passive", k::boolean},
        {"host_policy", k::string},
    };
    s.messages["SecondaryDevice"] = {{"kind", k::enumeration, false, "SecondaryDeviceKind"},
                                     {"device_id", k::int64}};
    s.messages["ModelTensorReshape"] = {{"shape", k::int64, rep}};
    s.messages["ModelInput"] = {
        {"name", k::string},
        {"data_type", k::enumeration, false, "DataType"},
        {"format", k::enumeration, false, "Format"},
        {"dims", k::int64, rep},
        {"reshape", k::message, false, "ModelTensorReshape"},
        {"is_shape_tensor", k::boolean},
        {"allow_ragged_batch", k::boolean},
        {"optional", k::boolean},
        {"is_non_linear_format_io", k::boolean},
    };
    s.messages["ModelOutput"] = {
        {"name", k::string},
        {"data_type", k::enumeration, false, "DataType"},
        {"dims", k::int64, rep},
        {"reshape", k::message, false, "ModelTensorReshape"},
        {"label_filename", k::string},
        {"is_shape_tensor", k::boolean},
        {"is_non_linear_format_io", k::boolean},
    };
    s.messages["BatchInput"] = {{"kind", k::enumeration, false, "BatchInputKind"},
                                {"target_name", k::string, rep},
                                {"data_type", k::enumeration, false, "DataType"},
                                {"source_input", k::string, rep}};
    s.messages["BatchOutput"] = {{"target_name", k::string, rep},
                                 {"kind", k::enumeration, false, "BatchOutputKind"},
                                 {"source_input", k::string, rep}};
    s.messages["ModelVersionPolicy"] = {
        {"latest", k::message, false, "VersionLatest", "policy_choice"},
        {"all", k::message, false, "Empty", "policy_choice"},
        {"specific", k::message, false, "VersionSpecific", "policy_choice"}};
    s.messages["VersionLatest"] = {{"num_versions", k::uint32}};
    s.messages["VersionSpecific"] = {{"versions", k::int64, rep}};
    s.messages["Empty"] = {};
    s.messages["ModelOptimizationPolicy"] = {
        {"graph", k::message, false, "OptimizationGraph"},
        {"priority", k::enumeration, false, "ModelPriority"},
        {"cuda", k::message, false, "OptimizationCuda"},
        {"execution_accelerators", k::message, false, "ExecutionAccelerators"},
        {"input_pinned_memory", k::message, false, "PinnedMemoryBuffer"},
        {"output_pinned_memory", k::message, false, "PinnedMemoryBuffer"},
        {"gather_kernel_buffer_threshold", k::uint32},
        {"eager_batching", k::boolean},
    };
    s.messages["OptimizationGraph"] = {{"level", k::int32}};
    s.messages["OptimizationCuda"] = {{"graphs", k::boolean},
                                      {"busy_wait_events", k::boolean},
                                      {"graph_spec", k::message, rep, "GraphSpec"},
                                      {"output_copy_stream", k::boolean}};
    s.messages["GraphSpec"] = {{"batch_size", k::int32},
                               {"input", k::message, rep, "map<string,GraphShape>"},
                               {"graph_lower_bound", k::message, false, "GraphLowerBound"}};
    s.messages["GraphLowerBound"] = {{"batch_size", k::int32},
                                     {"input", k::message, rep, "map<string,GraphShape>"}};
    s.messages["map<string,GraphShape>"] = {{"key", k::string},
                                            {"value", k::message, false, "GraphShape"}};
    s.messages["GraphShape"] = {{"dim", k::int64, rep}};
    s.messages["ExecutionAccelerators"] = {
        {"gpu_execution_accelerator", k::message, rep, "Accelerator"},
        {"cpu_execution_accelerator", k::message, rep, "Accelerator"}};
    s.messages["Accelerator"] = {{"name", k::string},
                                 {"parameters", k::message, rep, "map<string,string>"}};
    s.messages["PinnedMemoryBuffer"] = {{"enable", k::boolean}};
    s.messages["ModelQueuePolicy"] = {{"timeout_action", k::enumeration, false, "TimeoutAction"},
                                      {"default_timeout_microseconds", k::uint64},
                                      {"allow_timeout_override", k::boolean},
                                      {"max_queue_size", k::uint32}};
    s.messages["ModelDynamicBatching"] = {
        {"preferred_batch_size", k::int32, rep},
        {"max_queue_delay_microseconds", k::uint64},
        {"preserve_ordering", k::boolean},
        {"priority_levels", k::uint64},
        {"default_priority_level", k::uint64},
        {"default_queue_policy", k::message, false, "ModelQueuePolicy"},
        {"priority_queue_policy", k::message, rep, "map<uint64,ModelQueuePolicy>"},
    };
    s.messages["map<uint64,ModelQueuePolicy>"] = {
        {"key", k::uint64}, {"value", k::message, false, "ModelQueuePolicy"}};
    s.messages["ModelSequenceBatching"] = {
        {"direct", k::message, false, "StrategyDirect", "strategy_choice"},
        {"oldest", k::message, false, "StrategyOldest", "strategy_choice"},
        {"max_sequence_idle_microseconds", k::uint64},
        {"control_input", k::message, rep, "ControlInput"},
        {"state", k::message, rep, "SequenceState"},
        {"iterative_sequence", k::boolean},
    };
    s.messages["SequenceControl"] = {{"kind", k::enumeration, false, "ControlKind"},
                                     {"int32_false_true", k::int32, rep},
                                     {"fp32_false_true", k::real, rep},
                                     {"bool_false_true", k::boolean, rep},
                                     {"data_type", k::enumeration, false, "DataType"}};
    s.messages["ControlInput"] = {{"name", k::string},
                                  {"control", k::message, rep, "SequenceControl"}};
    s.messages["InitialState"] = {{"data_type", k::enumeration, false, "DataType"},
                                  {"dims", k::int64, rep},
                                  {"zero_data", k::boolean, false, {}, "state_data"},
                                  {"data_file", k::string, false, {}, "state_data"},
                                  {"name", k::string}};
    s.messages["SequenceState"] = {{"input_name", k::string},
                                   {"output_name", k::string},
                                   {"data_type", k::enumeration, false, "DataType"},
                                   {"dims", k::int64, rep},
                                   {"initial_state", k::message, rep, "InitialState"},
                                   {"use_same_buffer_for_input_output", k::boolean},
                                   {"use_growable_memory", k::boolean}};
    s.messages["StrategyDirect"] = {{"max_queue_delay_microseconds", k::uint64},
                                    {"minimum_slot_utilization", k::real}};
    s.messages["StrategyOldest"] = {{"max_candidate_sequences", k::int32},
                                    {"preferred_batch_size", k::int32, rep},
                                    {"max_queue_delay_microseconds", k::uint64},
                                    {"preserve_ordering", k::boolean}};
    s.messages["ModelEnsembling"] = {{"step", k::message, rep, "EnsembleStep"},
                                     {"max_inflight_requests", k::uint32}};
    s.messages["EnsembleStep"] = {{"model_name", k::string},
                                  {"model_version", k::int64},
                                  {"input_map", k::message, rep, "map<string,string>"},
                                  {"output_map", k::message, rep, "map<string,string>"},
                                  {"model_namespace", k::string}};
    s.messages["ModelWarmup"] = {{"name", k::string},
                                 {"batch_size", k::uint32},
                                 {"inputs", k::message, rep, "map<string,WarmupInput>"},
                                 {"count", k::uint32}};
    s.messages["map<string,WarmupInput>"] = {{"key", k::string},
                                             {"value", k::message, false, "WarmupInput"}};
    s.messages["WarmupInput"] = {
        {"data_type", k::enumeration, false, "DataType"},
        {"dims", k::int64, rep},
        {"zero_data", k::boolean, false, {}, "input_data_type"},
        {"random_data", k::boolean, false, {}, "input_data_type"},
        {"input_data_file", k::string, false, {}, "input_data_type"},
    };
    s.messages["ModelOperations"] = {{"op_library_filename", k::string, rep}};
    s.messages["ModelTransactionPolicy"] = {{"decoupled", k::boolean}};
    s.messages["ModelRepositoryAgents"] = {{"agents", k::message, rep, "RepositoryAgent"}};
    s.messages["RepositoryAgent"] = {{"name", k::string},
                                     {"parameters", k::message, rep, "map<string,string>"}};
    s.messages["ModelResponseCache"] = {{"enable", k::boolean}};
    s.messages["ModelMetrics"] = {{"metric_control", k::message, rep, "MetricControl"}};
    s.messages["MetricControl"] = {
        {"metric_identifier", k::message, false, "MetricIdentifier"},
        {"histogram_options", k::message, false, "HistogramOptions", "metric_options"}};
    s.messages["MetricIdentifier"] = {{"family", k::string}};
    s.messages["HistogramOptions"] = {{"buckets", k::real, rep}};
    return s;
  }
};

}  // namespace torchloom::detail

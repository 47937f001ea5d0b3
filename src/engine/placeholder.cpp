// Placeholder until the engine lands.
namespace deepinfer::engine_detail { int placeholder = 0; }

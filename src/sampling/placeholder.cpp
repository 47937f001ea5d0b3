// Placeholder until the sampler lands.
namespace deepinfer::sampling_detail { int placeholder = 0; }

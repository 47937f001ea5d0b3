#include "server/server.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "core/logging.h"
#include "deepinfer/error.h"
#include "server/async_engine.h"
#include "server/metrics.h"

namespace deepinfer::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

struct Shared {
  AsyncEngine* engine = nullptr;
  ServerContext ctx;
  ServerOptions opts;
  Metrics* metrics = nullptr;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};  // HTTP requests being handled (response not fully written)
};

enum class Route {
  kNone,
  kHealth,
  kMetrics,
  kModels,
  kModel,
  kChat,
  kCompletions,
  kFim,
  kMessages,
  kTokenize,
  kDetokenize,
  kVersion
};

struct RouteInfo {
  Route route = Route::kNone;
  http::verb method = http::verb::get;
  std::string name;  // for metrics
  std::string arg;   // /v1/models/{arg}
};

RouteInfo match(std::string path) {
  auto q = path.find('?');
  if (q != std::string::npos) path.resize(q);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.rfind("/anthropic/", 0) == 0) path = path.substr(10);
  if (path.rfind("/v1/", 0) == 0) path = path.substr(3);
  const auto G = http::verb::get, P = http::verb::post;
  if (path == "/health") return {Route::kHealth, G, "/health", ""};
  if (path == "/metrics") return {Route::kMetrics, G, "/metrics", ""};
  if (path == "/version") return {Route::kVersion, G, "/version", ""};
  if (path == "/models") return {Route::kModels, G, "/v1/models", ""};
  if (path.rfind("/models/", 0) == 0) return {Route::kModel, G, "/v1/models/{id}", path.substr(8)};
  if (path == "/chat/completions") return {Route::kChat, P, "/v1/chat/completions", ""};
  if (path == "/completions") return {Route::kCompletions, P, "/v1/completions", ""};
  if (path == "/beta/completions") return {Route::kFim, P, "/beta/completions", ""};
  if (path == "/messages") return {Route::kMessages, P, "/v1/messages", ""};
  if (path == "/tokenize") return {Route::kTokenize, P, "/tokenize", ""};
  if (path == "/detokenize") return {Route::kDetokenize, P, "/detokenize", ""};
  return {Route::kNone, G, "unknown", ""};
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, Shared& sh) : stream_(std::move(socket)), sh_(sh) {}

  void start() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::do_read, shared_from_this()));
  }

 private:
  void do_read() {
    parser_.emplace();
    parser_->body_limit(sh_.opts.max_body_bytes);
    parser_->header_limit(1 << 16);
    // The request line and headers (and the keep-alive idle wait before them) must arrive within
    // header_timeout_s, so a slow-loris client cannot hold a connection for long; the body gets 600 s.
    stream_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(sh_.opts.header_timeout_s * 1000)));
    http::async_read_header(stream_, buf_, *parser_,
                            beast::bind_front_handler(&Session::on_header, shared_from_this()));
  }

  void on_header(beast::error_code ec, std::size_t n) {
    if (ec) return on_read(ec, n);
    stream_.expires_after(std::chrono::seconds(600));
    http::async_read(stream_, buf_, *parser_, beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();
    }
    keep_alive_ = false;
    if (ec == http::error::body_limit) {
      route_name_ = "too_large";
      return send_error(413,
                        fmt::format("the request body is larger than the limit of {} bytes", sh_.opts.max_body_bytes));
    }
    if (ec == http::error::header_limit) {
      route_name_ = "too_large";
      return send_error(431, "the request headers are too large");
    }
    if (ec) {
      route_name_ = "bad_request";
      return send_error(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
    req_ = parser_->release();
    keep_alive_ = req_.keep_alive();
    handle();
  }

  void handle() {
    ++sh_.active;
    const RouteInfo ri = match(std::string(req_.target()));
    route_name_ = ri.name;
    anthropic_ = ri.route == Route::kMessages;
    if (ri.route == Route::kNone)
      return send_error(404,
                        fmt::format("no route {} {}", std::string(req_.method_string()), std::string(req_.target())));
    if (req_.method() != ri.method) {
      extra_header_ = ri.method == http::verb::get ? "GET" : "POST";
      return send_error(405, fmt::format("method {} is not allowed on {} (use {})", std::string(req_.method_string()),
                                         std::string(req_.target()), extra_header_));
    }
    if (ri.route == Route::kHealth) {
      if (sh_.draining) return send_error(503, "the server is shutting down");
      return send_json(200, OJson::object());
    }
    if (!sh_.opts.api_key.empty() && ri.route != Route::kMetrics && !authorized())
      return send_error(401, "invalid or missing API key: send 'Authorization: Bearer <key>' (or 'x-api-key')", "",
                        "invalid_api_key");
    try {
      switch (ri.route) {
        case Route::kMetrics:
          return send_text(200, sh_.metrics->render(sh_.ctx.served_model_name), "text/plain; version=0.0.4");
        case Route::kVersion:
          return send_json(200, OJson{{"version", "0.1.0"}});
        case Route::kModels:
          return send_json(200, models_body(sh_.ctx));
        case Route::kModel:
          if (ri.arg != sh_.ctx.served_model_name)
            return send_error(404, fmt::format("The model `{}` does not exist", ri.arg), "model", "model_not_found");
          return send_json(200, models_body(sh_.ctx)["data"][0]);
        case Route::kTokenize:
          return send_json(200, tokenize_body(req_.body(), sh_.ctx));
        case Route::kDetokenize:
          return send_json(200, detokenize_body(req_.body(), sh_.ctx));
        case Route::kChat:
          return generate(prepare_chat(req_.body(), sh_.ctx));
        case Route::kCompletions:
          return generate(prepare_completion(req_.body(), sh_.ctx, false));
        case Route::kFim:
          return generate(prepare_completion(req_.body(), sh_.ctx, true));
        case Route::kMessages:
          return generate(prepare_messages(req_.body(), sh_.ctx));
        default:
          return send_error(404, "no such route");
      }
    } catch (const ApiError& e) {
      return send_error(e.status, e.what(), e.param, e.code, e.type);
    } catch (const std::exception& e) {
      return send_error(500, fmt::format("internal error: {}", e.what()));
    }
  }

  bool authorized() const {
    const std::string& key = sh_.opts.api_key;
    auto it = req_.find(http::field::authorization);
    if (it != req_.end() && std::string(it->value()) == "Bearer " + key) return true;
    auto x = req_.find("x-api-key");
    return x != req_.end() && std::string(x->value()) == key;
  }

  // ---- generation ---------------------------------------------------------------------------------
  void generate(Job job) {
    if (sh_.draining) return send_error(503, "the server is shutting down");
    if (sh_.engine->num_in_flight() >= sh_.opts.max_queued_requests)
      return send_error(429,
                        fmt::format("the server is at capacity ({} requests in flight, --max-queued-requests); retry "
                                    "later",
                                    sh_.engine->num_in_flight()),
                        "", "rate_limit_exceeded", "rate_limit_error");
    request_id_ = job.request_id;
    builder_ = std::move(job.builder);
    streaming_ = job.stream;
    in_request_ = true;
    ++gen_;
    // One engine request per prompt (several only for /v1/completions with a list of prompts).
    // Submitted before anything is written, so a client that has seen the stream start also sees
    // its request counted in flight; outputs are posted to this strand and handled after we return.
    sub_ids_.assign(1, request_id_);
    for (size_t k = 1; k <= job.more_prompts.size(); ++k) sub_ids_.push_back(fmt::format("{}-{}", request_id_, k));
    sub_done_.assign(sub_ids_.size(), false);
    sub_n_ = job.params.n;
    auto self = shared_from_this();
    auto cb = [self](const RequestOutput& out) {
      net::post(self->stream_.get_executor(), [self, out] { self->on_engine_output(out); });
    };
    for (size_t k = 1; k < sub_ids_.size(); ++k)
      sh_.engine->submit(sub_ids_[k], std::move(job.more_prompts[k - 1]), job.params, cb);
    sh_.engine->submit(request_id_, std::move(job.prompt), std::move(job.params), cb);
    if (streaming_) {
      sh_.metrics->count_http(route_name_, 200);
      std::string head =
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
          "Transfer-Encoding: chunked\r\nServer: deepinfer\r\nx-request-id: " +
          request_id_ + "\r\n" + (keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n") + "\r\n";
      pending_ += head;
      push_chunk(builder_->stream_start());
      do_write();
    }
    watch_disconnect();
  }

  void abort_all() {
    for (size_t k = 0; k < sub_ids_.size(); ++k)
      if (!sub_done_[k]) sh_.engine->abort(sub_ids_[k]);
  }

  // Notices a client that closes its connection while we generate (it sends nothing meanwhile).
  void watch_disconnect() {
    const uint64_t gen = gen_;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
      if (gen != self->gen_ || !self->in_request_) return;
      if (ec == net::error::operation_aborted) return;  // we closed the socket ourselves
      if (!ec) {
        // A wait can complete without the peer having done anything (the reactor's readiness is
        // edge-triggered and may be stale): peek to tell EOF from "nothing to read".
        char c;
        const ssize_t r = ::recv(self->stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r > 0) return;  // the client sent more (a pipelined request): it is there
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->watch_disconnect();
      }
      self->client_gone();  // EOF, reset or another socket error
    });
  }

  void client_gone() {
    if (!in_request_) return;
    log_info("serve: client of {} went away; aborting it", request_id_);
    abort_all();
    end_request();
    keep_alive_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  void end_request() {
    if (!in_request_) return;
    in_request_ = false;
    builder_.reset();
    request_id_.clear();
    --sh_.active;
  }

  void on_engine_output(const RequestOutput& sub) {
    if (!in_request_) return;  // a late output of an ended request
    size_t k = 0;
    while (k < sub_ids_.size() && sub_ids_[k] != sub.request_id) ++k;
    if (k == sub_ids_.size()) return;
    sub_done_[k] = sub.finished;
    RequestOutput merged;
    const RequestOutput* outp = &sub;
    if (sub_ids_.size() > 1) {  // prompt k's children are choices k * n ..
      merged = sub;
      merged.request_id = request_id_;
      for (CompletionOutput& c : merged.outputs) c.index += static_cast<int>(k) * sub_n_;
      merged.finished = std::all_of(sub_done_.begin(), sub_done_.end(), [](bool d) { return d; });
      outp = &merged;
    }
    const RequestOutput& out = *outp;
    if (out.error) {
      abort_all();
      const bool internal = out.error->rfind("engine step failed", 0) == 0;
      if (streaming_) {
        push_chunk(builder_->stream_error(*out.error));
        finish_stream();
      } else {
        send_error(internal ? 500 : 400, *out.error);
      }
      return;
    }
    std::string s;
    try {
      s = builder_->on_output(out);
    } catch (const std::exception& e) {
      log_warn("serve: {}: {}", request_id_, e.what());
      abort_all();
      if (streaming_) {
        push_chunk(builder_->stream_error(e.what()));
        return finish_stream();
      }
      return send_error(500, fmt::format("internal error: {}", e.what()));
    }
    if (streaming_) {
      push_chunk(s);
      if (out.finished) return finish_stream();
      do_write();
    } else if (out.finished) {
      const OJson body = builder_->final_body();
      sh_.metrics->count_http(route_name_, 200);
      write_response(200, dump(body), "application/json", true);
    }
  }

  void push_chunk(const std::string& s) {
    if (s.empty()) return;
    pending_ += fmt::format("{:x}\r\n", s.size());
    pending_ += s;
    pending_ += "\r\n";
  }

  void finish_stream() {
    pending_ += "0\r\n\r\n";
    stream_finished_ = true;
    do_write();
  }

  void do_write() {
    if (writing_ || pending_.empty() || !stream_.socket().is_open()) return;
    writing_ = true;
    inflight_.swap(pending_);
    pending_.clear();
    stream_.expires_after(std::chrono::seconds(120));
    net::async_write(stream_, net::buffer(inflight_),
                     beast::bind_front_handler(&Session::on_write, shared_from_this()));
  }

  void on_write(beast::error_code ec, std::size_t) {
    writing_ = false;
    inflight_.clear();
    if (ec) {
      if (in_request_) return client_gone();
      return close();
    }
    if (!pending_.empty()) return do_write();
    if (stream_finished_) {
      stream_finished_ = false;
      end_request();
      if (keep_alive_) return do_read();
      return close();
    }
  }

  // ---- plain responses ----------------------------------------------------------------------------
  void send_error(int status, const std::string& message, const std::string& param = "", const std::string& code = "",
                  const std::string& type = "") {
    const OJson body =
        anthropic_ ? anthropic_error_body(status, message) : openai_error_body(status, message, param, code, type);
    sh_.metrics->count_http(route_name_, status);
    if (status >= 500) log_warn("serve: {} {}: {}", status, route_name_, message);
    write_response(status, dump(body), "application/json", in_request_);
  }
  void send_json(int status, const OJson& body) {
    sh_.metrics->count_http(route_name_, status);
    write_response(status, dump(body), "application/json", false);
  }
  void send_text(int status, std::string body, const char* type) {
    sh_.metrics->count_http(route_name_, status);
    write_response(status, std::move(body), type, false);
  }

  // Writes a complete response; `was_generating`: a generation request ends with it.
  void write_response(int status, std::string body, const char* content_type, bool was_generating) {
    if (was_generating) {
      in_request_ = false;
      builder_.reset();
    }
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    res->set(http::field::server, "deepinfer");
    res->set(http::field::content_type, content_type);
    if (!request_id_.empty()) res->set("x-request-id", request_id_);
    if (status == 405) res->set(http::field::allow, extra_header_);
    if (sh_.draining) keep_alive_ = false;
    res->keep_alive(keep_alive_);
    res->body() = std::move(body);
    res->prepare_payload();
    stream_.expires_after(std::chrono::seconds(120));
    http::async_write(stream_, *res, [self = shared_from_this(), res, status](beast::error_code ec, std::size_t) {
      --self->sh_.active;
      self->request_id_.clear();
      if (!ec && status == 413) return self->linger();
      if (ec || !self->keep_alive_) return self->close();
      self->do_read();
    });
  }

  // After a 413 the client may still be sending its body: read and drop it (up to 64 MiB or 10 s)
  // so that it gets to read our answer instead of a connection reset.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(10));
    drain_buf_.resize(1 << 16);
    do_linger();
  }
  void do_linger() {
    stream_.async_read_some(net::buffer(drain_buf_), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
      self->drained_ += n;
      if (ec || self->drained_ > (uint64_t{64} << 20)) return self->close();
      self->do_linger();
    });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.socket().close(ec);
  }

  beast::tcp_stream stream_;
  Shared& sh_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  bool keep_alive_ = true;
  bool anthropic_ = false;
  std::string route_name_;
  std::string extra_header_;
  // The generation in flight.
  std::string request_id_;
  std::unique_ptr<ResponseBuilder> builder_;
  std::vector<std::string> sub_ids_;  // its engine requests (one per prompt)
  std::vector<bool> sub_done_;
  int sub_n_ = 1;
  bool streaming_ = false;
  bool in_request_ = false;
  uint64_t gen_ = 0;
  std::string pending_, inflight_;
  bool writing_ = false;
  bool stream_finished_ = false;
  std::vector<char> drain_buf_;
  uint64_t drained_ = 0;
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(net::io_context& ioc, tcp::endpoint ep, Shared& sh) : ioc_(ioc), acceptor_(net::make_strand(ioc)), sh_(sh) {
    beast::error_code ec;
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) fail("serve: cannot listen on {}:{}: {}", ep.address().to_string(), ep.port(), ec.message());
  }
  void run() { do_accept(); }
  void stop() {
    net::post(acceptor_.get_executor(), [self = shared_from_this()] {
      beast::error_code ec;
      self->acceptor_.close(ec);
    });
  }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  void do_accept() {
    acceptor_.async_accept(net::make_strand(ioc_), beast::bind_front_handler(&Listener::on_accept, shared_from_this()));
  }
  void on_accept(beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (!ec) {
      socket.set_option(tcp::no_delay(true), ec);
      std::make_shared<Session>(std::move(socket), sh_)->start();
    }
    do_accept();
  }
  net::io_context& ioc_;
  tcp::acceptor acceptor_;
  Shared& sh_;
};

}  // namespace

int run_server(std::unique_ptr<EngineCore> engine, ServerContext ctx, const ServerOptions& opts) {
  net::io_context ioc{std::max(1, opts.http_threads)};
  Metrics metrics;
  AsyncEngine async(std::move(engine), &metrics);
  Shared sh;
  sh.engine = &async;
  sh.ctx = std::move(ctx);
  sh.opts = opts;
  sh.metrics = &metrics;

  beast::error_code ec;
  const auto addr = net::ip::make_address(opts.host, ec);
  if (ec) fail("serve: --host '{}' is not an IP address: {}", opts.host, ec.message());
  auto listener = std::make_shared<Listener>(ioc, tcp::endpoint(addr, static_cast<uint16_t>(opts.port)), sh);
  listener->run();

  net::signal_set signals(ioc, SIGINT, SIGTERM);
  net::steady_timer drain_timer(ioc);
  std::chrono::steady_clock::time_point drain_start;
  std::function<void()> poll_drain = [&] {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - drain_start).count();
    if (sh.active.load() <= 0 || waited > opts.drain_timeout_s) {
      if (sh.active.load() > 0) log_warn("serve: drain timeout; {} requests cut off", sh.active.load());
      ioc.stop();
      return;
    }
    drain_timer.expires_after(std::chrono::milliseconds(20));
    drain_timer.async_wait([&](beast::error_code) { poll_drain(); });
  };
  signals.async_wait([&](beast::error_code e, int sig) {
    if (e) return;
    log_info("serve: signal {}: no new connections; draining {} requests", sig, sh.active.load());
    sh.draining = true;
    listener->stop();
    drain_start = std::chrono::steady_clock::now();
    poll_drain();
    signals.async_wait([&](beast::error_code e2, int) {
      if (!e2) ioc.stop();  // a second signal: stop now
    });
  });

  std::fprintf(stderr, "deepinfer serve: model %s (%s) listening on http://%s:%u\n", sh.ctx.served_model_name.c_str(),
               sh.ctx.model_path.c_str(), opts.host.c_str(), static_cast<unsigned>(listener->port()));
  std::fflush(stderr);

  std::vector<std::thread> threads;
  for (int i = 1; i < opts.http_threads; ++i) threads.emplace_back([&ioc] { ioc.run(); });
  ioc.run();
  for (auto& t : threads) t.join();
  async.stop();
  log_info("serve: stopped");
  return 0;
}

}  // namespace deepinfer::server

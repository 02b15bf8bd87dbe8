-- wrk script for the point-lookup benchmark (tests/bench/test_bench_faust.py).
--
--   wrk -t1 -cN -dS -s tests/bench/wrk_point.lua http://HOST:PORT -- MODE KEYS_FILE
--
-- MODE picks the request, each for a key drawn at random from KEYS_FILE (one key a line):
--   faust  GET  /kv/<key>/                      the Faust worker's table_route view
--   rest   GET  /v1/stores/kv/keys/<key>        Federator's REST lookup
--   sql    POST /v1/sql  {"sql": "SELECT * FROM kv WHERE key = ?", "parameters": ["<key>"]}
--   body   POST /v1/sql  with the line itself as the JSON body (any statement; the leaderboard's)
-- Requests are built once per thread (POOL of them, keys drawn with a per-thread seed), so
-- wrk spends no time formatting while it measures. At the end one line is printed:
--   WRK_JSON {"requests": ..., "seconds": ..., "errors": ..., "p50_us": ..., "p99_us": ..., ...}
-- With WRK_ANSWERS=PATH in the environment, every answer is also written to PATH.<thread id> as
-- "<status> <body length>\n<body>\n", for the caller to check each one (wrk then hands every
-- response's body to Lua, which costs it a few microseconds an answer).
-- With WRK_HOSTS=HOST:PORT,HOST:PORT,... the threads (-t) take those servers in turn, as
-- clients behind a load balancer would: wrk spreads the connections evenly over its threads.

local POOL = 20000
local requests_pool = {}
local next_id = 0
local answers_path = os.getenv("WRK_ANSWERS")
local answers = nil

-- defined only when asked: wrk reads response bodies into Lua only for a script that has it
if answers_path ~= nil then
  function response(status, headers, body)
    answers:write(status, " ", #body, "\n", body, "\n")
  end
end

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end) .. '"'
end

local builders = {
  faust = function(key) return wrk.format("GET", "/kv/" .. key .. "/") end,
  rest = function(key) return wrk.format("GET", "/v1/stores/kv/keys/" .. key) end,
  sql = function(key)
    local body = '{"sql": "SELECT * FROM kv WHERE key = ?", "parameters": [' .. json_string(key) .. ']}'
    return wrk.format("POST", "/v1/sql", {["Content-Type"] = "application/json"}, body)
  end,
  body = function(line) return wrk.format("POST", "/v1/sql", {["Content-Type"] = "application/json"}, line) end,
}

local hosts = {}
for host, port in (os.getenv("WRK_HOSTS") or ""):gmatch("([^,:]+):(%d+)") do
  hosts[#hosts + 1] = {host, port}
end

function setup(thread)
  thread:set("id", next_id)
  if #hosts > 0 then
    local h = hosts[next_id % #hosts + 1]
    thread.addr = wrk.lookup(h[1], h[2])[1]
  end
  next_id = next_id + 1
end

function init(args)
  local mode, keys_file = args[1], args[2]
  local build = builders[mode]
  if build == nil or keys_file == nil then
    error("usage: wrk ... -s wrk_point.lua URL -- faust|rest|sql|body KEYS_FILE")
  end
  local keys = {}
  for line in io.lines(keys_file) do
    if #line > 0 then keys[#keys + 1] = line end
  end
  if answers_path ~= nil then
    answers = assert(io.open(answers_path .. "." .. (id or 0), "wb"))
  end
  math.randomseed(1000 + (id or 0))
  for i = 1, POOL do
    requests_pool[i] = build(keys[math.random(#keys)])
  end
  counter = 0
end

function request()
  counter = counter + 1
  if counter > POOL then counter = 1 end
  return requests_pool[counter]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "seconds": %.6f, "errors": %d, "connect_errors": %d, "read_errors": %d, ' ..
    '"write_errors": %d, "status_errors": %d, "timeouts": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"p999_us": %d, "max_us": %d, "mean_us": %.1f}\n',
    summary.requests, summary.duration / 1e6, e.connect + e.read + e.write + e.status + e.timeout,
    e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max, latency.mean))
end

# The RESP door of a real sluiced called by redis-rb (Debian's ruby-redis, RESP2) with its default
# settings: CL.THROTTLE single, pipelined and in MULTI/EXEC, DEL, AUTH, and SLUICE.CHECK against
# the rules. tests/interop/resp/run.sh starts sluiced and sets SLUICE_RESP_PORT,
# SLUICE_RESP_AUTH_PORT and SLUICE_RESP_PASSWORD; every call has a 5 s timeout. Minitest (Ruby's
# stdlib) runs the cases; a failure makes the exit code non-zero.
require "minitest/autorun"
require "redis"

PORT = Integer(ENV.fetch("SLUICE_RESP_PORT"))
AUTH_PORT = Integer(ENV.fetch("SLUICE_RESP_AUTH_PORT"))
PASSWORD = ENV.fetch("SLUICE_RESP_PASSWORD")
# redis-cell's README example: a fresh key, burst 15, 30 per 60 s.
FRESH = [0, 16, 15, -1, 2].freeze

class RedisRbAgainstSluice < Minitest::Test
  def client(port = PORT, **options)
    Redis.new(host: "127.0.0.1", port: port, timeout: 5, reconnect_attempts: 0, **options)
  end

  def throttle(r, key)
    r.call("CL.THROTTLE", key, 15, 30, 60)
  end

  def test_a_fresh_key_gets_redis_cells_five_integers
    r = client
    assert_equal "PONG", r.ping
    assert_equal FRESH, throttle(r, "rb-user123")
    assert_equal [0, 16, 14, -1], throttle(r, "rb-user123")[0, 4]
  ensure
    r&.close
  end

  def test_a_pipeline_is_answered_in_order
    r = client
    replies = r.pipelined { |p| 5.times { throttle(p, "rb-pipe") } }
    assert_equal [15, 14, 13, 12, 11], replies.map { |x| x[2] }
    replies.each { |x| assert_equal [0, 16, -1], [x[0], x[1], x[3]] }
  ensure
    r&.close
  end

  def test_multi_exec_answers_every_queued_command
    r = client
    replies = r.multi { |m| 2.times { throttle(m, "rb-multi") } }
    assert_equal 2, replies.size
    assert_equal FRESH, replies[0]
    assert_equal [0, 16, 14, -1], replies[1][0, 4]
  ensure
    r&.close
  end

  def test_del_counts_the_keys_that_existed_and_the_key_starts_fresh
    r = client
    2.times { throttle(r, "rb-del") }
    assert_equal 1, r.del("rb-del", "rb-never-seen")
    assert_equal FRESH, throttle(r, "rb-del")
  ensure
    r&.close
  end

  def test_auth_noauth_before_wrong_password_fails_right_one_works
    r = client(AUTH_PORT)
    assert_equal "PONG", r.ping # PING needs no password (health probes)
    e = assert_raises(Redis::CommandError) { r.echo("x") }
    assert_equal "NOAUTH Authentication required.", e.message
    e = assert_raises(Redis::CommandError) { client(AUTH_PORT, password: "not-the-password").ping }
    assert_match(/\AWRONGPASS /, e.message)
    assert_equal "OK", r.auth(PASSWORD)
    assert_equal "PONG", r.ping
    assert_equal FRESH, throttle(client(AUTH_PORT, password: PASSWORD), "rb-auth")
  ensure
    r&.close
  end

  def test_sluice_check_allows_up_to_the_rule_then_denies
    r = client
    got = Array.new(4) { r.call("SLUICE.CHECK", "api", "user", "rb-ann") }
    # allowed, limit, remaining, retry_after_s, reset_s, shadow, would_deny
    assert_equal [[1, 3, 2], [1, 3, 1], [1, 3, 0], [0, 3, 0]], got.map { |x| x[0, 3] }
    assert_operator got[3][3], :>, 0, "a denied check has a retry after"
    assert(got.all? { |x| x.size == 7 && x[5, 2] == [0, 0] }, "shadow and would_deny")
  ensure
    r&.close
  end
end

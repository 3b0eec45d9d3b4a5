module github.com/redis-ratelimit/redis-ratelimit/clients/go

go 1.26

require github.com/redis/go-redis/v9 v9.23.0

package io.redisratelimit.spring.web;

import io.redisratelimit.spring.RateLimitExceededException;
import io.redisratelimit.spring.RateLimitHeaders;
import io.redisratelimit.spring.RateLimitService;
import org.springframework.core.Ordered;
import org.springframework.core.annotation.Order;
import org.springframework.http.HttpHeaders;
import org.springframework.http.HttpStatus;
import org.springframework.http.MediaType;
import org.springframework.http.ProblemDetail;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.RestControllerAdvice;

import java.net.URI;
import java.util.List;

/** Answers a {@link RateLimitExceededException} with 429, a {@link ProblemDetail} and the rate-limit fields. */
@RestControllerAdvice
@Order(Ordered.HIGHEST_PRECEDENCE)
public class RateLimitExceptionHandler {
    private final RateLimitService service;

    public RateLimitExceptionHandler(RateLimitService service) {
        this.service = service;
    }

    @ExceptionHandler(io.redisratelimit.spring.RateLimitKeyMissingException.class)
    public ResponseEntity<ProblemDetail> keyMissing(io.redisratelimit.spring.RateLimitKeyMissingException e) {
        ProblemDetail body = ProblemDetail.forStatusAndDetail(HttpStatus.BAD_REQUEST, e.getMessage());
        return ResponseEntity.status(HttpStatus.BAD_REQUEST).contentType(MediaType.APPLICATION_PROBLEM_JSON).body(body);
    }

    @ExceptionHandler(RateLimitExceededException.class)
    public ResponseEntity<ProblemDetail> tooManyRequests(RateLimitExceededException e) {
        ProblemDetail body = ProblemDetail.forStatusAndDetail(HttpStatus.TOO_MANY_REQUESTS, RateLimitHeaders.detail(e.rule(), e.decision()));
        body.setType(URI.create(RateLimitHeaders.QUOTA_EXCEEDED));
        body.setTitle(RateLimitHeaders.TITLE);
        body.setProperty("violated-policies", List.of(e.rule()));
        HttpHeaders headers = new HttpHeaders();
        RateLimitHeaders.of(service, e.rules(), e.decision()).forEach(headers::set);
        headers.setContentType(MediaType.APPLICATION_PROBLEM_JSON);
        return ResponseEntity.status(HttpStatus.TOO_MANY_REQUESTS).headers(headers).body(body);
    }
}

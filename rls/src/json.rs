//! /json's proto3 JSON mapping of RateLimitRequest and RateLimitResponse.
//! (Stub; the HTTP helper writes the real module.)
